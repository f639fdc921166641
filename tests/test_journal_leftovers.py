"""Journals left over in the private directory by runs that died: `vramscope report --list`
lists them (start, pid, whether the process runs, steps, size, command) and says how to make
a report; they are pruned by a stated rule (7 days, the 20 newest), never one whose process
still runs; the directory is private (0700), nothing in it is followed through a symbolic
link, and a command line is text, never markup, in the terminal and in HTML."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest
import torch

import vramscope
from vramscope.cli.main import main
from vramscope.journal import files, leftovers

HOUR = 3600.0
DAY = 24 * HOUR


@pytest.fixture(scope="module")
def journal_bytes(tmp_path_factory) -> bytes:
    """A real journal of 3 steps, written by track()."""
    path = tmp_path_factory.mktemp("journal") / "run.journal"
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with vramscope.track(journal=path, name="train.py"):
        for _ in range(3):
            model(torch.randn(2, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    return path.read_bytes()


@pytest.fixture
def private(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(folder))
    return folder


def dead_pid() -> int:
    """The pid of a process that has ended."""
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def place(
    folder: Path, data: bytes, pid: int, age_s: float = 0.0, header: dict | None = None
) -> Path:
    """A journal written by process ``pid``, last written ``age_s`` ago; ``header``: fields
    to change in its header."""
    if header:
        first, rest = data.split(b"\n", 1)
        fields = json.loads(first)
        fields.update(header)
        data = json.dumps(fields).encode() + b"\n" + rest
    path = folder / f"{pid}-{os.urandom(4).hex()}.journal"
    path.write_bytes(data)
    when = time.time() - age_s
    os.utime(path, (when, when))
    return path


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ended:
        main(args)
    out, err = capsys.readouterr()
    return int(ended.value.code or 0), out, err


def test_the_list_says_what_each_journal_is_and_how_to_make_its_report(
    private, journal_bytes, capsys
):
    dead = place(private, journal_bytes, dead_pid(), age_s=HOUR)
    alive = place(private, journal_bytes, os.getpid())  # this process: a run in progress
    lines = journal_bytes.split(b"\n")
    lines[2] = b"\x00 overwritten"
    damaged = place(private, b"\n".join(lines), dead_pid(), age_s=2 * HOUR)
    foreign = place(private, b"PK\x03\x04 a zip file", dead_pid(), age_s=3 * HOUR)

    code, out, err = run_cli(["report", "--list", "--json", "-"], capsys)
    assert code == 0, err
    listing = json.loads(out)
    assert listing["directory"] == str(private)
    assert (listing["keep_days"], listing["keep_count"]) == (7, 20)
    by_path = {entry["path"]: entry for entry in listing["journals"]}
    assert set(by_path) == {str(p) for p in (dead, alive, damaged, foreign)}
    assert not by_path[str(dead)]["alive"] and by_path[str(alive)]["alive"]
    for path in (dead, alive):
        entry = by_path[str(path)]
        assert entry["steps"] == 3 and entry["size_bytes"] == len(journal_bytes)
        assert entry["name"] == "train.py" and entry["problem"] is None
        assert entry["command"] and entry["started_at"] is not None
    assert by_path[str(damaged)]["problem"] == "damaged: 1 line left out"
    assert by_path[str(foreign)]["steps"] is None
    assert "not a vramscope journal" in by_path[str(foreign)]["problem"]

    code, out, err = run_cli(["report", "--list"], capsys)
    assert code == 0, err
    assert f"pid {dead.name.split('-')[0]} · died · 3 steps" in out
    assert f"pid {os.getpid()} · running · 3 steps" in out
    assert f"vramscope report {dead} --json run.json --html run.html" in out
    assert "A left-over is removed after 7 days, and beyond the 20 newest." in out

    code, out, err = run_cli(["report", str(dead), "-q", "--json", str(private / "r.json")], capsys)
    assert code == 0, err
    assert len(json.loads((private / "r.json").read_text())["steps"]) == 3


def test_an_empty_or_missing_directory_lists_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(tmp_path / "none"))
    code, out, _ = run_cli(["report", "--list"], capsys)
    assert code == 0 and out.startswith(f"No journals in {tmp_path / 'none'}")
    assert not (tmp_path / "none").exists()  # listing makes nothing
    code, _, err = run_cli(["report", "--list", str(tmp_path / "x.journal")], capsys)
    assert code == 2 and "--list takes no PATH" in err
    code, _, err = run_cli(["report"], capsys)
    assert code == 2 and "give the PATH of a report or a journal (or --list)" in err


def test_left_overs_go_after_seven_days_and_beyond_the_twenty_newest(private, journal_bytes):
    fresh = place(private, journal_bytes, dead_pid(), age_s=HOUR)
    week_old = place(private, journal_bytes, dead_pid(), age_s=6 * DAY)
    too_old = place(private, journal_bytes, dead_pid(), age_s=8 * DAY)
    running = place(private, journal_bytes, os.getpid())
    stale_temp = private / f".{dead_pid()}-0a1b2c3d.journal.deadbeef.tmp"
    stale_temp.write_bytes(journal_bytes)
    other = private / "notes.txt"
    other.write_text("not ours to remove")

    with vramscope.track():  # a new journal there prunes first
        pass
    assert fresh.exists() and week_old.exists() and running.exists() and other.exists()
    assert not too_old.exists() and not stale_temp.exists()

    many = [place(private, journal_bytes, dead_pid(), age_s=2 * HOUR + i) for i in range(22)]
    removed = leftovers.prune()
    # 24 left-overs (fresh, week_old and the 22): the 4 oldest go, the running one stays
    assert sorted(removed) == sorted([week_old.name, *(p.name for p in many[-3:])])
    assert fresh.exists() and running.exists()
    assert [p.exists() for p in many] == [True] * 19 + [False] * 3
    assert leftovers.prune(keep_count=0) and [p.name for p in private.glob("*.journal")] == [
        running.name
    ]


def test_nothing_in_the_directory_is_followed_through_a_link(private, journal_bytes, tmp_path):
    outside = tmp_path / "outside.journal"
    outside.write_bytes(journal_bytes)
    os.utime(outside, (time.time() - 30 * DAY,) * 2)
    link = private / f"{dead_pid()}-0badf00d.journal"
    link.symlink_to(outside)
    fifo = private / f"{dead_pid()}-0000fade.journal"
    os.mkfifo(fifo)  # a reader that opened it would hang

    assert leftovers.list_journals() == []
    leftovers.prune(keep_count=0)
    assert link.is_symlink() and outside.read_bytes() == journal_bytes  # neither read nor removed
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_a_directory_others_can_reach_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "private"
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(folder))
    path = files.private_path()
    assert path.parent == folder and stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.chmod(0o755)
    code, out, err = run_cli(["report", "--list"], capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("vramscope: error: ") and f"chmod 700 {folder}" in line
    folder.chmod(0o700)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(tmp_path / "link"))
    (tmp_path / "link").symlink_to(elsewhere)
    code, _, err = run_cli(["report", "--list"], capsys)
    assert code == 2 and "is a symlink; refusing to use it" in err


def test_a_command_line_is_text_in_the_terminal_and_escaped_in_html(private, journal_bytes, capsys):
    hostile = "<img src=x onerror=alert(1)>"
    path = place(
        private,
        journal_bytes,
        dead_pid(),
        header={
            "command": ["python", "train.py", "[bold red]loud[/]", f"</script>{hostile}"],
            "name": f"test_x[{hostile}]",
            "workload": {"spec": f"test_x[{hostile}]"},
        },
    )
    code, out, err = run_cli(["report", "--list"], capsys)
    assert code == 0, err
    assert "[bold red]loud[/]" in out and hostile in out  # shown as written, not as markup

    page = private / "r.html"
    code, _, err = run_cli(["report", str(path), "-q", "--html", str(page)], capsys)
    assert code == 0, err
    html = page.read_text()
    assert "onerror=alert(1)>" not in html and "<img src=x" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html  # the workload's name, escaped
