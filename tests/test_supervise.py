"""How ``proxray serve`` (and the drift demo) end what they started when stopped (``proxray.cli.serving``): every
process started under the supervised command carries its mark, and a stop ends each of them — one whose parent
exited first and left it to init, as a group SIGTERM can leave Serve's HAProxy, and one started while the stop went on,
as HAProxy's reload starts one — so the ports they held are free at once. The races ``tests/test_serve_stop.py`` meets
by chance, made to happen every time; local processes on 127.0.0.1, a few seconds."""
import os
import socket
import sys
import textwrap
import time

from proxray.cli import serving
from proxray.serve.front import free_port

# holds a port on 127.0.0.1 until told to stop; with a successor's port, a SIGTERM first starts the successor (which
# inherits the mark) holding that port, as a reloading HAProxy does, and then exits
HOLDER = textwrap.dedent("""
    import os, signal, socket, subprocess, sys, time
    s = socket.socket()
    s.bind(("127.0.0.1", int(sys.argv[1])))
    s.listen()
    def stop(*_):
        if len(sys.argv) > 2:
            subprocess.Popen([sys.executable, __file__, sys.argv[2]], start_new_session=True)
            time.sleep(0.5)
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    open(os.path.join(os.path.dirname(__file__), sys.argv[1] + ".up"), "w").close()
    while True:
        time.sleep(1)
""")


def free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def until(check, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "not within the bound"
        time.sleep(0.05)


def test_a_stop_ends_a_process_its_parent_left_and_one_started_during_the_stop(tmp_path):
    holder = tmp_path / "holder.py"
    holder.write_text(HOLDER)
    orphan, reloading, successor = free_port(), free_port(), free_port()
    # the supervised command: starts a holder in a session of its own (its parent, the command, exits on SIGTERM
    # without waiting for it: it is left to init) and a holder that starts a successor when told to stop
    script = (f"{sys.executable} {holder} {orphan} & "
              f"{sys.executable} {holder} {reloading} {successor} & "
              "trap 'exit 0' TERM; while true; do sleep 0.1; done")
    child, marker = serving.start_marked(["bash", "-c", script], env={**os.environ}, out=open(tmp_path / "log", "w"))
    until(lambda: (tmp_path / f"{orphan}.up").exists() and (tmp_path / f"{reloading}.up").exists())
    assert not free(orphan) and not free(reloading) and len(serving.marked(marker)) >= 3
    serving.stop_marked(child, marker)
    assert child.poll() is not None
    until(lambda: (tmp_path / f"{successor}.up").exists() or free(successor), 10)
    assert free(orphan) and free(reloading) and free(successor), serving.marked(marker)
    assert serving.marked(marker) == {} or all(_zombie(p) for p in serving.marked(marker))


def _zombie(pid: int) -> bool:
    try:
        return serving._stat(pid)[0] == "Z"
    except (OSError, IndexError):
        return True
