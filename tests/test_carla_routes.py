"""Bench2Drive route XML parsing/splitting and route -> navigation commands."""
import textwrap
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from wam_diff_ros.carla.route_planner import RoutePlanner, command_for
from wam_diff_ros.carla.route_xml import RouteFileError, parse_routes, split_route_file

ROUTES = textwrap.dedent("""\
    <?xml version="1.0" encoding="utf-8"?>
    <routes>
      <route id="1711" town="Town12">
        <waypoints>
          <position x="-497.6" y="3672.9" z="364.9"/>
          <position x="-497.6" y="3670.9" z="364.8"/>
          <position x="-497.7" y="3630.9" z="364.2"/>
        </waypoints>
        <scenarios>
          <scenario name="ParkingCutIn_1" type="ParkingCutIn">
            <direction value="left"/>
            <trigger_point x="-497.7" y="3659.9" yaw="-90.2" z="364.7"/>
          </scenario>
        </scenarios>
        <weathers>
          <weather route_percentage="100" cloudiness="100.0" precipitation="50.0" sun_altitude_angle="45.0"/>
          <weather route_percentage="0" cloudiness="20.0" precipitation="0.0" sun_altitude_angle="45.0"/>
        </weathers>
      </route>
      <route id="2086" town="Town13">
        <waypoints>
          <position x="10.0" y="0.0" z="0.0"/>
          <position x="30.0" y="0.0" z="0.0"/>
        </waypoints>
        <scenarios>
          <scenario name="YieldToEmergencyVehicle_1" type="YieldToEmergencyVehicle">
            <distance value="140"/>
            <trigger_point x="12.0" y="0.0" yaw="0.0" z="0.0"/>
          </scenario>
        </scenarios>
        <weathers>
          <weather route_percentage="0" cloudiness="5.0"/>
        </weathers>
      </route>
      <route id="3" town="Town01">
        <waypoints><position x="0" y="0" z="0"/><position x="5" y="0" z="0"/></waypoints>
      </route>
    </routes>
""")


@pytest.fixture
def route_file(tmp_path):
    p = tmp_path / "routes.xml"
    p.write_text(ROUTES)
    return p


def test_route_file_parses_waypoints_scenarios_and_sorted_weathers(route_file):
    routes = parse_routes(route_file)
    assert [r.id for r in routes] == ["1711", "2086", "3"]
    r = routes[0]
    assert r.town == "Town12" and r.waypoints.shape == (3, 3)
    np.testing.assert_allclose(r.waypoints[1], [-497.6, 3670.9, 364.8])
    assert r.scenario_type == "ParkingCutIn"
    sc = r.scenarios[0]
    assert sc.name == "ParkingCutIn_1" and sc.trigger == (-497.7, 3659.9, 364.7, -90.2)
    assert sc.params == {"direction": "left"}
    assert [w.route_percentage for w in r.weathers] == [0.0, 100.0]
    assert r.weathers[1].params["precipitation"] == 50.0
    assert routes[1].scenarios[0].params == {"distance": "140"}
    assert r.length_m == pytest.approx(2.0 + np.hypot(0.1, 40.0))
    assert routes[2].scenarios == () and routes[2].scenario_type == ""


@pytest.mark.parametrize("bad, message", [
    ('<routes><route id="1" town="T"><waypoints><position x="a" y="0"/><position x="1" y="0"/></waypoints></route></routes>',
     "'a'"),
    ('<routes><route id="1"><waypoints/></route></routes>', "town"),
    ('<routes><route id="1" town="T"><waypoints><position x="0" y="0"/></waypoints></route></routes>', "at least 2"),
    ('<route id="1" town="T"/>', "<routes>"),
    ('<routes><route id="1" town="T"><waypoints><position x="0" y="0"/><position x="1" y="0"/></waypoints>'
     '<scenarios><scenario name="s" type="t"/></scenarios></route></routes>', "trigger_point"),
])
def test_bad_route_files_raise_naming_the_problem(tmp_path, bad, message):
    p = tmp_path / "bad.xml"
    p.write_text(bad)
    with pytest.raises(RouteFileError, match=message):
        parse_routes(p)


def test_duplicate_route_ids_are_rejected(tmp_path):
    p = tmp_path / "dup.xml"
    one = '<route id="7" town="T"><waypoints><position x="0" y="0"/><position x="1" y="0"/></waypoints></route>'
    p.write_text(f"<routes>{one}{one}</routes>")
    with pytest.raises(RouteFileError, match="duplicate route id '7'"):
        parse_routes(p)


def test_split_route_file_round_robin_keeps_elements_verbatim(route_file, tmp_path):
    outs = [tmp_path / "s0.xml", tmp_path / "s1.xml"]
    ids = split_route_file(route_file, outs)
    assert ids == [["1711", "3"], ["2086"]]
    assert [r.id for r in parse_routes(outs[0])] == ["1711", "3"]
    sc = ET.parse(outs[1]).getroot().find("route/scenarios/scenario/distance")
    assert sc.get("value") == "140"


def test_road_options_map_to_navigation_commands():
    assert command_for(4) == "follow lane" and command_for("LEFT") == "turn left"
    assert command_for(2) == "turn right" and command_for(3) == "go straight"
    assert command_for(5) == "change lane left" and command_for(6) == "change lane right"
    assert command_for(-1) == "follow lane"
    with pytest.raises(ValueError, match="unknown RoadOption"):
        command_for(42)


def test_route_planner_announces_a_turn_within_lookahead_and_never_goes_back():
    # straight 0..100 m along x, a left turn option at x = 50, lane follow after it
    xs = np.arange(0.0, 101.0, 10.0)
    pts = np.stack([xs, np.zeros_like(xs)], 1)
    opts = ["LANEFOLLOW"] * len(xs)
    opts[5] = "LEFT"
    rp = RoutePlanner(pts, opts)
    assert rp.update((1.0, 0.5)).command == "follow lane"     # turn 49 m ahead: beyond 20 m
    t = rp.update((32.0, 0.0))                                  # turn 18 m ahead
    assert t.command == "turn left" and t.index == 3
    assert rp.update((61.0, 0.0)).command == "follow lane"     # past the turn
    assert rp.update((0.0, 0.0)).index == 6                     # progress is monotonic
    end = rp.update((99.0, 1.0))
    assert end.done and end.remaining_m == 0.0
