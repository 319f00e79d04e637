import socket

from mmrun.common import ports


def test_a_picked_port_is_free_and_below_the_ephemeral_range():
    start = ports._ephemeral_start()
    port = ports.free_port("127.0.0.1")
    assert ports.LOWEST <= port < start
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # nothing holds it


def test_a_listening_port_is_not_free():
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        assert not ports.is_free(busy.getsockname()[1])


def test_a_machine_without_room_below_its_range_still_gets_a_port(monkeypatch, tmp_path):
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text(f"{ports.LOWEST + 10}\t60999\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", range_file)
    assert ports.is_free(ports.free_port())
