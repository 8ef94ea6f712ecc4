"""CARLA <-> ego frame conversion, compass, GNSS projection (checked against the real carla client)."""
import math

import numpy as np
import pytest

from wam_diff_ros.carla import frames

carla = pytest.importorskip("carla")


@pytest.mark.parametrize("yaw_deg", [0.0, 37.0, -90.0, 180.0, 251.3])
def test_point_10m_ahead_2m_right_in_carla_is_10_minus2_in_ego(yaw_deg):
    ego = carla.Transform(carla.Location(x=12.5, y=-40.0, z=0.3), carla.Rotation(yaw=yaw_deg))
    fwd, right = ego.get_forward_vector(), ego.get_right_vector()
    point = ego.location + fwd * 10.0 + right * 2.0
    ego_xy = frames.carla_to_ego([[point.x, point.y]], [ego.location.x, ego.location.y], yaw_deg)
    np.testing.assert_allclose(ego_xy, [[10.0, -2.0]], atol=1e-5)  # carla vectors are float32


def test_round_trip_carla_ego_carla_is_exact():
    rng = np.random.default_rng(0)
    pts = rng.uniform(-500, 500, size=(50, 2))
    for yaw in (0.0, 33.3, -171.0):
        back = frames.ego_to_carla(frames.carla_to_ego(pts, (3.0, -7.0), yaw), (3.0, -7.0), yaw)
        np.testing.assert_allclose(back, pts, rtol=0, atol=1e-9)
        ego = rng.uniform(-50, 50, size=(8, 2))
        np.testing.assert_allclose(frames.carla_to_ego(frames.ego_to_carla(ego, (3.0, -7.0), yaw), (3.0, -7.0), yaw),
                                   ego, rtol=0, atol=1e-9)


def test_yaw_signs_carla_clockwise_is_negative_ego_heading():
    # CARLA yaw +90 faces +y_carla, which is the right-handed world's -y: a clockwise (right) turn
    assert frames.carla_yaw_to_heading(90.0) == pytest.approx(-math.pi / 2)
    assert frames.heading_to_carla_yaw(frames.carla_yaw_to_heading(-33.0)) == pytest.approx(-33.0)
    # a vehicle facing yaw +90 sees the CARLA world origin's +x axis point on its left
    np.testing.assert_allclose(frames.carla_to_ego([[1.0, 0.0]], [0.0, 0.0], 90.0), [[0.0, 1.0]], atol=1e-12)


def test_compass_to_heading_matches_carla_yaw():
    # the IMU compass is clockwise from north (CARLA -y): yaw 0 (east) reads pi/2, yaw -90 (north) reads 0
    for yaw, compass in ((0.0, math.pi / 2), (-90.0, 0.0), (90.0, math.pi), (180.0, 3 * math.pi / 2)):
        assert float(frames.wrap_angle(frames.compass_to_heading(compass) - frames.carla_yaw_to_heading(yaw))) \
            == pytest.approx(0.0, abs=1e-12)


def test_vehicle_vectors_right_is_negative_y_and_right_turn_negative_yaw_rate():
    ego = frames.ego_state_from_imu(8.0, accelerometer=[1.0, 0.5, 9.8], gyroscope=[0.0, 0.0, 0.2])
    assert (ego.vx, ego.ax, ego.ay, ego.yaw_rate) == (8.0, 1.0, -0.5, -0.2)
    # world velocity straight along CARLA +y for a vehicle with yaw 90 is pure forward speed
    st = frames.ego_state_from_carla([0.0, 5.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 10.0], 90.0)
    assert st.vx == pytest.approx(5.0) and st.vy == pytest.approx(0.0, abs=1e-12)
    assert st.yaw_rate == pytest.approx(-math.radians(10.0))


XODR = """<?xml version="1.0" standalone="yes"?>
<OpenDRIVE><header revMajor="1" revMinor="4" name="" version="1" north="0" south="0" east="0" west="0">
<geoReference><![CDATA[+lat_0=49.0 +lon_0=8.0]]></geoReference></header>
<road name="r" length="100.0" id="1" junction="-1"><link/>
<planView><geometry s="0.0" x="0.0" y="0.0" hdg="0.0" length="100.0"><line/></geometry></planView>
<lanes><laneSection s="0.0">
<center><lane id="0" type="none" level="false"><link/></lane></center>
<right><lane id="-1" type="driving" level="false"><link/><width sOffset="0.0" a="3.5" b="0" c="0" d="0"/></lane></right>
</laneSection></lanes></road></OpenDRIVE>"""


def test_gnss_projection_matches_carla_geolocation_and_inverts():
    cmap = carla.Map("tiny", XODR)
    proj = frames.GeoProjection(49.0, 8.0)
    for x, y in ((0.0, 0.0), (120.5, -300.25), (-2000.0, 1500.0)):
        g = cmap.transform_to_geolocation(carla.Location(x=x, y=y, z=0.0))
        lat, lon = proj.to_gnss(x, y)
        assert (lat, lon) == pytest.approx((g.latitude, g.longitude), abs=1e-10)
        assert proj.to_world(lat, lon) == pytest.approx((x, y), abs=1e-6)


def test_geo_reference_is_recovered_from_route_points():
    proj = frames.GeoProjection(49.0, 8.0)
    world = [(100.0 + 7 * i, -250.0 + 3 * i) for i in range(10)]
    gnss = [proj.to_gnss(x, y) for x, y in world]
    fit = frames.GeoProjection.fit(gnss, world)
    assert fit.lat_ref == pytest.approx(49.0, abs=1e-7) and fit.lon_ref == pytest.approx(8.0, abs=1e-7)
    assert fit.to_world(*proj.to_gnss(-321.0, 654.0)) == pytest.approx((-321.0, 654.0), abs=1e-3)
