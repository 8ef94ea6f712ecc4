"""Official leaderboard / Bench2Drive result files: re-scoring by hand-computed numbers, errors, the written layout."""
import copy
import json
import math
from pathlib import Path

import pytest

from wam_diff_core import cli
from wam_diff_core.eval import leaderboard as lb
from wam_diff_core.eval.bench2drive import ScoreError
from wam_diff_core.errors import WamDiffError

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "bench2drive_results.json"

# The fixture's six routes, each re-scored by hand (completion x one coefficient per infraction message):
#   1711 ParkingCutIn (emergency_brake)      Perfect, 100 %, no infraction          -> 100                 success
#   1773 ParkedObstacle (overtaking)         100 %, 1 vehicle collision + 1 red light -> 100 x 0.6 x 0.7 = 42
#   1790 HazardAtSideLane (overtaking)       Failed (blocked) at 37.5 %, 1 layout collision
#                                            (vehicle_blocked costs only the lost completion) -> 37.5 x 0.65 = 24.375
#   2086 YieldToEmergencyVehicle (give_way)  100 %, outside lanes "(7.43% of the completed route)" and a min-speed
#                                            message (unused in Bench2Drive) -> 100 x (1 - 0.0743) = 92.57;
#                                            the file's 92.5688 used the unrounded 7.4312 %: within the tolerance
#   2273 SignalizedJunctionLeftTurn (merging, traffic_signs)  100 %, 1 stop infraction -> 100 x 0.8 = 80,
#                                            but its score_composed says 100: the one mismatch
#   2416 InvadingTurn (give_way)             100 %, only a min-speed message -> 100                   success
HAND_SCORES = {"1711": 100.0, "1773": 42.0, "1790": 24.375, "2086": 92.57, "2273": 80.0, "2416": 100.0}
# DS = (100 + 42 + 24.375 + 92.57 + 80 + 100) / 6 = 438.945 / 6 = 73.1575
HAND_DS = 438.945 / 6
# stored DS = (100 + 42 + 24.375 + 92.5688 + 100 + 100) / 6 = 458.9438 / 6 = 76.490633
HAND_DS_STORED = 458.9438 / 6
# SR: 1711 and 2416 succeed (min speed excepted) -> 2 / 6 = 33.333 %
HAND_SR = 100.0 * 2 / 6
# abilities (success share): emergency_brake 1711 -> 1/1; overtaking 1773, 1790 -> 0/2; give_way 2086 (outside
# lanes), 2416 -> 1/2; merging 2273 -> 0/1; traffic_signs 2273 -> 0/1; mean (100 + 0 + 50 + 0 + 0) / 5 = 30
HAND_ABILITIES = {"merging": 0.0, "overtaking": 0.0, "emergency_brake": 100.0, "give_way": 50.0, "traffic_signs": 0.0}
# efficiency: mean of the min-speed percentages, (80 + 60) / 2 = 70


def fixture_data():
    return json.loads(FIXTURE.read_text())


def record(data, rid):
    return next(r for r in data["_checkpoint"]["records"] if r["route_id"] == f"RouteScenario_{rid}_rep0")


def test_fixture_rescored_ds_sr_abilities_equal_hand_computed_values():
    res = lb.score_results(lb.load_results(FIXTURE), str(FIXTURE))
    assert {rid: r["score"] for rid, r in res["routes"].items()} == pytest.approx(HAND_SCORES)
    assert res["driving_score"] == pytest.approx(HAND_DS) and round(res["driving_score"], 4) == 73.1575
    assert res["driving_score_stored"] == pytest.approx(HAND_DS_STORED)
    assert res["success_rate"] == pytest.approx(HAND_SR)
    assert res["abilities"] == pytest.approx(HAND_ABILITIES)
    assert res["abilities_mean"] == pytest.approx(30.0)
    assert res["efficiency"] == pytest.approx(70.0)
    assert [r for r, row in res["routes"].items() if row["success"]] == ["1711", "2416"]
    assert res["mismatches"] == [{"route_id": "2273", "score_composed": 100.0, "recomputed": pytest.approx(80.0),
                                  "difference": pytest.approx(-20.0)}]
    assert res["num_routes"] == 6 and res["missing_routes"] == 0


def test_cli_leaderboard_prints_table_and_writes_the_hand_computed_json(tmp_path, capsys):
    out = tmp_path / "rescored.json"
    assert cli.main(["score", "--leaderboard", str(FIXTURE), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "driving score 73.16 (score_composed in the file: 76.49)   success rate 33.33 %   routes 6" in text
    assert "2273: score_composed 100.0000, recomputed 80.0000" in text
    written = json.loads(out.read_text())
    assert written["driving_score"] == pytest.approx(HAND_DS)
    assert written["abilities"] == pytest.approx(HAND_ABILITIES)


def test_routes_the_run_was_given_without_a_record_score_zero():
    data = fixture_data()
    data["_checkpoint"]["progress"] = [6, 8]  # two routes never got a record
    res = lb.score_results(data)
    assert res["driving_score"] == pytest.approx(438.945 / 8)
    assert res["success_rate"] == pytest.approx(100.0 * 2 / 8)
    assert res["missing_routes"] == 2


@pytest.mark.parametrize("name", ["collision_vehicles", "collisions_vehicles", "red_lights", "min_speed"])
def test_unknown_infraction_name_is_an_error_naming_route_and_key(name):
    data = fixture_data()
    record(data, 1711)["infractions"][name] = ["Agent collided against object"]
    with pytest.raises(lb.LeaderboardError, match=rf"route 1711: infractions\.{name} is not a leaderboard infraction"):
        lb.score_results(data)


@pytest.mark.parametrize("value", [100.5, -0.1, 250, "most", None, True])
def test_route_completion_outside_0_to_100_is_an_error(value):
    data = fixture_data()
    record(data, 1773)["scores"]["score_route"] = value
    with pytest.raises(ScoreError, match=r"route 1773: scores\.score_route is .*; expected a percentage in 0\.\.100"):
        lb.score_results(data)


def test_nan_anywhere_a_number_is_read_is_an_error_naming_the_key(tmp_path):
    cases = {
        ("scores", "score_route"): r"route 2086: scores\.score_route is nan",
        ("scores", "score_composed"): r"route 2086: scores\.score_composed is nan; expected a finite number",
        ("scores", "score_penalty"): r"route 2086: scores\.score_penalty is nan",
    }
    for (group, key), message in cases.items():
        data = fixture_data()
        record(data, 2086)[group][key] = math.nan
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps(data))  # json writes the NaN literal, as Python's json in the evaluator would
        with pytest.raises(WamDiffError, match=message):
            lb.score_results(lb.load_results(path))
    data = fixture_data()
    record(data, 2086)["infractions"]["outside_route_lanes"] = [
        "Agent went outside its route lanes for about 18.278 meters (nan% of the completed route)"]
    with pytest.raises(ScoreError, match=r"route 2086: infractions\.outside_route_lanes percentage is 'nan'"):
        lb.score_results(data)


def test_outside_lanes_message_without_a_percentage_or_above_100_is_an_error():
    data = fixture_data()
    record(data, 2086)["infractions"]["outside_route_lanes"] = ["Agent went outside its route lanes"]
    with pytest.raises(lb.LeaderboardError, match=r"route 2086: infractions\.outside_route_lanes message"):
        lb.score_results(data)
    record(data, 2086)["infractions"]["outside_route_lanes"] = ["for about 9 meters (130.0% of the completed route)"]
    with pytest.raises(ScoreError, match=r"percentage is '130\.0'; expected a percentage in 0\.\.100"):
        lb.score_results(data)


def test_malformed_files_are_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    for text, expected in (("{", "not a JSON leaderboard result file"),
                           ('{"records": []}', "expected a leaderboard result file with a _checkpoint.records list"),
                           ('{"_checkpoint": {"records": [{"status": "Perfect"}]}}', "is not a route record")):
        bad.write_text(text)
        assert cli.main(["score", "--leaderboard", str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("wam-diff score: error: ") and expected in err and len(err.strip().splitlines()) == 1
    data = fixture_data()
    data["_checkpoint"]["records"].append(copy.deepcopy(record(data, 1711)))
    with pytest.raises(lb.LeaderboardError, match="route 1711 has two records"):
        lb.score_results(data)
    assert cli.main(["score", "--leaderboard", str(tmp_path / "absent.json")]) == 2
    assert "no such result file" in capsys.readouterr().err


def test_cli_leaderboard_unknown_name_exits_2_with_route_and_key(tmp_path, capsys):
    data = fixture_data()
    record(data, 1773)["infractions"]["collision_vehicle"] = record(data, 1773)["infractions"].pop("collisions_vehicle")
    path = tmp_path / "misspelt.json"
    path.write_text(json.dumps(data))
    assert cli.main(["score", "--leaderboard", str(path)]) == 2
    assert "route 1773: infractions.collision_vehicle is not a leaderboard infraction" in capsys.readouterr().err


def test_written_layout_is_the_evaluators_and_rewriting_the_fixture_changes_nothing():
    data = fixture_data()
    again = lb.results_file(data["_checkpoint"]["records"], total=6, sensors=data["sensors"])
    assert again == data
    assert set(data) == {"_checkpoint", "entry_status", "eligible", "sensors", "values", "labels"}
    assert set(data["_checkpoint"]) == {"global_record", "progress", "records"}
    for rec in data["_checkpoint"]["records"]:
        assert set(rec) == {"index", "route_id", "scenario_name", "weather_id", "save_name", "town_name", "status",
                            "num_infractions", "infractions", "scores", "meta"}
        assert list(rec["infractions"]) == list(lb.OFFICIAL_KINDS)
    glob = data["_checkpoint"]["global_record"]
    # scores_mean.score_route = (5 x 100 + 37.5) / 6 = 89.583333; score_penalty = (1 + 0.42 + 0.65 + 0.925688 + 1 + 1)
    # / 6 = 0.832615; score_composed = the stored DS 76.490633
    assert glob["scores_mean"] == {"score_composed": 76.490633, "score_route": 89.583333, "score_penalty": 0.832615}
    assert glob["meta"]["exceptions"] == [["RouteScenario_1790_rep0", 2, "Failed - Agent got blocked"]]
    assert len(data["values"]) == len(data["labels"]) == 15 and data["values"][0] == "76.490633"
    assert data["entry_status"] == "Finished" and data["eligible"] is True


def test_partial_records_are_completed_with_recomputed_scores_and_an_unfinished_run_is_started():
    partial = [{"route_id": "RouteScenario_5_rep0", "status": "Completed",
                "infractions": {"collisions_pedestrian": ["Agent collided against object with type=walker"]},
                "scores": {"score_route": 100.0}}]
    data = lb.results_file(partial, total=2)
    rec = data["_checkpoint"]["records"][0]
    assert rec["scores"] == {"score_route": 100.0, "score_penalty": 0.5, "score_composed": 50.0}
    assert rec["num_infractions"] == 1 and rec["infractions"]["red_light"] == []
    assert data["_checkpoint"]["progress"] == [1, 2] and data["entry_status"] == "Started" and not data["eligible"]
    assert lb.score_results(data)["driving_score"] == pytest.approx(25.0)  # (50 + 0) / 2
