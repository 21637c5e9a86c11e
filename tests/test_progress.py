"""The job's one progress display: per-model rows done / total, rows/s and ETA; redrawn in place on a
terminal, plain rate-limited log lines otherwise."""
import io

from proxray.common.progress import Progress


def test_plain_lines_per_model_and_for_the_whole_job(capsys):
    p = Progress({"a": 10, "b": 4}, tty=False, every_s=3600)
    p.update("a", 3)
    p.update("a", 2)  # within every_s of the last line for "a": no line
    p.update("b", 3, errors=1)  # b is complete: its last line is always written
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2
    assert "a: 3/10 rows," in lines[0] and "rows/s, ETA " in lines[0] and "all 2 models: 3/14 rows" in lines[0]
    assert "b: 4/4 rows (1 errors)" in lines[1] and ", done |" in lines[1] and "all 2 models: 9/14 rows" in lines[1]


def test_terminal_block_is_redrawn_in_place():
    out = io.StringIO()
    p = Progress({"a": 2, "b": 2}, stream=out, tty=True)
    p.update("a", 2)
    p.update("b", 1)
    text = out.getvalue()
    first, second = text.split("\x1b[3F")  # the second draw moves up over the three lines of the first
    assert first.count("\n") == 3 and "a: 2/2 rows" in first and "b: 0/2 rows" in first
    assert "b: 1/2 rows" in second and "all 2 models: 3/4 rows" in second and "ETA" in second
