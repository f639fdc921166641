"""The run's journal: written as the run goes, private, never through a link, bounded on a
long run; read back as far as it is intact (a cut-off last line is normal, a damaged line
is one line and exit code 2); the report made from it is the session's own; how a process
ended is said in the report's words; the signals `run`'s parent passes on."""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from pathlib import Path

import pytest
import torch

import vramscope
from vramscope import schema
from vramscope.cli.main import main
from vramscope.journal import writer
from vramscope.journal.ending import OOM_KILLER, Ending, exit_info, oom_kill_counter
from vramscope.journal.reader import JournalError, parse_journal, read_journal
from vramscope.journal.rebuild import report_from_journal
from vramscope.journal.supervise import ACK_WAIT_S, REPORTED, _Relay
from vramscope.tracking.records import StepHistory

MIB = 2**20


class Training:
    """A tiny model trained a step at a time, as a user's loop does."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(16, 16)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)

    def step(self) -> None:
        self.opt.zero_grad()
        self.model(torch.randn(4, 16)).sum().backward()
        self.opt.step()


def write_journal(path: Path, steps: int = 4) -> vramscope.Session:
    run = Training()
    with vramscope.track(journal=path) as session:
        for _ in range(steps):
            run.step()
    return session


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as ended:
        main(args)
    out, err = capsys.readouterr()
    return int(ended.value.code or 0), out, err


# ---- written as the run goes --------------------------------------------------------------


def test_each_step_is_in_the_journal_as_soon_as_it_is_stored(tmp_path):
    """Steps further apart than STEP_WRITE_GAP_S: each written when it is stored."""
    path = tmp_path / "run.journal"
    run = Training()
    with vramscope.track(journal=path):
        for i in range(4):
            time.sleep(writer.STEP_WRITE_GAP_S)
            run.step()  # step i ends when step i + 1 begins (or the session stops)
            assert [s.index for s in read_journal(path).steps] == list(range(i))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    journal = read_journal(path)
    assert [s.index for s in journal.steps] == [0, 1, 2, 3]
    assert journal.stopped and journal.script_exit == {"status": "ok", "code": 0, "error": None}
    assert journal.intact and not journal.truncated


def test_short_steps_reach_the_journal_a_write_every_few_steps_and_within_a_flush(tmp_path):
    """Steps stored closer together wait for the next write: a later step's, or the
    sampler's flush (within FLUSH_EVERY_S and a sample's interval), every one of them."""
    path = tmp_path / "run.journal"
    run = Training()
    writes: list[int] = []
    with vramscope.track(journal=path) as session:
        journal_writer = session._journal
        inner = journal_writer._write_steps

        def counted() -> None:
            writes.append(len(session._steps.records))
            inner()

        journal_writer._write_steps = counted
        for _ in range(40):
            run.step()
        stored = [r.index for r in session._steps.records]
        assert len(stored) >= 40 - 1  # the CPU reads every step
        assert len(writes) < len(stored) / 2  # a write every few steps, not one each
        deadline = time.monotonic() + writer.FLUSH_EVERY_S + 2.0
        while time.monotonic() < deadline:  # the sampler's flush takes the rest
            written = [s.index for s in read_journal(path).steps]
            if written == stored:
                break
            time.sleep(0.05)
        assert written == stored
    assert [s.index for s in read_journal(path).steps] == list(range(40))


def test_the_report_from_the_journal_is_the_sessions_own(tmp_path):
    path = tmp_path / "run.journal"
    session = write_journal(path, steps=6)
    own, made = session.report(), report_from_journal(read_journal(path))
    assert schema.errors(json.loads(made.to_json())) == []
    assert made.steps == own.steps  # every field: phases, times, host RSS of each step
    assert made.phases == own.phases and made.epochs == own.epochs
    assert made.categories_at_peak == own.categories_at_peak
    assert made.categories_at_peak.parameters == 4 * (16 * 16 + 16)
    assert made.peak == own.peak and made.startup == own.startup
    assert made.timeline.t == own.timeline.t
    assert made.timeline.host_rss_bytes == own.timeline.host_rss_bytes
    assert made.exit.status == "ok" and made.exit.source == "journal"
    assert made.workload == own.workload and made.device == own.device


def test_a_journal_in_the_private_directory_is_removed_when_the_session_stops(
    tmp_path, monkeypatch
):
    private = tmp_path / "private"
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(private))
    run = Training()
    with vramscope.track() as session:
        run.step()
        deadline = time.monotonic() + 1.0  # (opened on the sampler's thread)
        while session._journal is None and time.monotonic() < deadline:
            time.sleep(0.01)
        path = session._journal.path
        assert path.parent == private and path.name.endswith(".journal")
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not path.exists()


def test_the_journal_replaces_a_link_and_never_writes_through_it(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("not for vramscope")
    link = tmp_path / "run.journal"
    link.symlink_to(secret)
    write_journal(link, steps=2)
    assert secret.read_text() == "not for vramscope"
    assert not link.is_symlink() and stat.S_IMODE(link.stat().st_mode) == 0o600


def test_a_long_run_keeps_its_journal_bounded_and_every_step_counted(tmp_path, monkeypatch):
    """Compacted at 32 KiB, a step table of at most 200 entries here (4 MiB and 2,048
    entries by default): the file never grows past about twice its compacted size, and the
    report made from it counts every step, in order, as the session's own does."""
    monkeypatch.setattr(writer, "COMPACT_AT_BYTES", 32 * 1024)
    monkeypatch.setattr(writer, "STEP_WRITE_GAP_S", 0.0)  # a write each step: the most lines
    path = tmp_path / "long.journal"
    run = Training()
    session = vramscope.track(journal=path)
    session._steps = StepHistory(capacity=200, head=16)  # (before it starts: a small table)
    largest = 0
    with session:
        for _ in range(1500):
            run.step()
            largest = max(largest, path.stat().st_size)
        compactions = session._journal._compactions
    journal = read_journal(path)
    report, own = report_from_journal(journal), session.report()
    assert compactions >= 3 and journal.header["compactions"] == compactions
    assert largest < 200 * 1024
    assert sum(s.count for s in report.steps) == 1500
    covered = [i for s in report.steps for i in range(s.index, (s.last_index or s.index) + 1)]
    assert covered == list(range(1500))
    assert len(journal.steps) < 400  # the step table's entries, and those written since
    assert report.peak.host_rss_bytes == own.peak.host_rss_bytes
    assert report.phases == own.phases


def test_steps_that_waited_for_a_write_are_counted_when_the_step_table_merges_them(tmp_path):
    """Short steps wait for the next write (STEP_WRITE_GAP_S); a merge of the step table
    (a long run) can move those not written yet away from its end: each is still written."""
    path = tmp_path / "merged.journal"
    run = Training()
    session = vramscope.track(journal=path)
    session._steps = StepHistory(capacity=100, head=8)  # merges after ~100 steps, and again
    with session:
        for _ in range(600):
            run.step()
    report = report_from_journal(read_journal(path))
    covered = [i for s in report.steps for i in range(s.index, (s.last_index or s.index) + 1)]
    assert covered == list(range(600))
    assert sum(s.count for s in report.steps) == 600


def test_a_step_the_sampler_could_not_read_is_written_by_the_next_write(tmp_path, monkeypatch):
    """The sampler's thread writes the steps that waited; a record the run changes while it
    is read there (encoding it raises) is read again by the next write, with the records
    before it in the same write: none is lost."""
    path = tmp_path / "flaky.journal"
    encode, failed = writer.encode_step, []

    def flaky(record, t0):
        if record.index == 3 and not failed:
            failed.append(record.index)
            raise RuntimeError("dictionary changed size during iteration")
        return encode(record, t0)

    monkeypatch.setattr(writer, "encode_step", flaky)
    monkeypatch.setattr(writer, "STEP_WRITE_GAP_S", 60.0)  # every step waits for a flush
    run = Training()
    with vramscope.track(journal=path) as session:
        for _ in range(6):
            run.step()
        session._journal._flush_steps()  # (or the sampler's, whichever reads step 3 first)
        session._journal._flush_steps()
        assert failed == [3]
        assert [s.index for s in read_journal(path).steps] == list(range(5))
    assert [s.index for s in read_journal(path).steps] == list(range(6))


def test_a_forked_child_never_writes_its_parents_journal(tmp_path):
    path = tmp_path / "run.journal"
    run = Training()
    with vramscope.track(journal=path) as session:
        run.step()
        pid = os.fork()
        if pid == 0:  # as a DataLoader worker would be: the hooks are copied, not the journal
            try:
                run.step()
                run.step()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        run.step()
        run.step()
    journal = read_journal(path)
    assert journal.intact
    assert report_from_journal(journal).steps == session.report().steps


def journals_seen(folder: Path, record: list[list[str]], expect: bool = True):
    """A workload whose every batch notes the journals in ``folder`` at that moment (one in
    the private directory is opened on the sampler's thread: ``expect`` waits a second at
    most for it)."""

    def build(batch_size: int, device: torch.device) -> vramscope.Workload:
        run = Training()

        def batch():
            deadline = time.monotonic() + (1.0 if expect else 0.0)
            while not list(folder.glob("*.journal")) and time.monotonic() < deadline:
                time.sleep(0.01)
            record.append(sorted(p.name for p in folder.glob("*.journal")))
            return (torch.randn(batch_size, 16),)

        def loss(model, x):
            return model(x).sum()

        return vramscope.Workload(model=run.model, optimizer=run.opt, batch=batch, loss=loss)

    return build


def test_measure_journals_as_track_does(tmp_path, monkeypatch):
    private = tmp_path / "private"
    monkeypatch.setenv("VRAMSCOPE_STATUS_DIR", str(private))
    seen: list[list[str]] = []
    vramscope.measure(journals_seen(private, seen), batch_size=2, steps=3, device="cpu")
    assert [len(names) for names in seen] == [1, 1, 1]  # the private directory's, as it went
    assert seen[0][0].startswith(f"{os.getpid()}-")
    assert list(private.glob("*.journal")) == []  # removed when the steps ended

    path = tmp_path / "m.journal"  # a path: kept, and it holds the report's steps
    report = vramscope.measure(journals_seen(tmp_path, []), 2, steps=3, device="cpu", journal=path)
    assert report_from_journal(read_journal(path)).steps == report.steps

    seen.clear()
    vramscope.measure(
        journals_seen(private, seen, expect=False), 2, steps=2, device="cpu", journal=None
    )
    assert seen == [[], []]


def test_measure_on_the_command_line_journals_beside_its_json(tmp_path, monkeypatch, capsys):
    (tmp_path / "wl.py").write_text(
        "import os, torch, vramscope\n"
        "def build(batch_size, device):\n"
        "    model = torch.nn.Linear(16, 16)\n"
        "    def batch():\n"
        "        print('journal there:', os.path.exists('m.journal'))\n"
        "        return (torch.randn(batch_size, 16),)\n"
        "    return vramscope.Workload(model=model, optimizer=torch.optim.SGD(model.parameters()),\n"
        "                              batch=batch, loss=lambda m, x: m(x).sum())\n"
    )
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(
        ["measure", "wl.py:build", "-b", "2", "--steps", "2", "--json", "m.json"], capsys
    )
    assert code == 0 and out.count("journal there: True") == 2
    assert not (tmp_path / "m.journal").exists() and (tmp_path / "m.json").is_file()


# ---- read back as far as it is intact ---------------------------------------------------------


def test_a_cut_off_last_line_is_left_out_and_said_not_an_error(tmp_path, capsys):
    path = tmp_path / "run.journal"
    write_journal(path, steps=4)
    cut = tmp_path / "cut.journal"
    data = path.read_bytes()
    cut.write_bytes(data[: data.rindex(b'{"k":"end"') + 25])  # killed while writing it
    journal = read_journal(cut)
    assert journal.truncated and journal.intact and not journal.stopped
    report = report_from_journal(journal)
    assert [s.index for s in report.steps] == [0, 1, 2, 3]
    assert any("last line was cut off" in n for n in report.extra["tracking_notes"])
    code, out, err = run_cli(["report", str(cut)], capsys)
    assert code == 0, err
    assert "Steps (4)" in out


def test_a_damaged_line_is_left_out_and_the_rest_reported_then_exit_2(tmp_path, capsys):
    path = tmp_path / "run.journal"
    write_journal(path, steps=5)
    lines = path.read_bytes().split(b"\n")
    step_lines = [i for i, line in enumerate(lines) if line.startswith(b'{"k":"step"')]
    lines[step_lines[1]] = b"\x00\x17 overwritten"
    damaged = tmp_path / "damaged.journal"
    damaged.write_bytes(b"\n".join(lines))
    journal = read_journal(damaged)
    assert journal.problems == [f"line {step_lines[1] + 1}: not a record"]
    assert [s.index for s in journal.steps] == [0, 2, 3, 4]
    out_json = tmp_path / "r.json"
    code, _, err = run_cli(["report", "-q", "--json", str(out_json), str(damaged)], capsys)
    assert code == 2
    assert err.strip().splitlines() == [
        f"vramscope: error: {damaged} is damaged: 1 line left out (line "
        f"{step_lines[1] + 1}: not a record); the report is made from the rest"
    ]
    assert [s["index"] for s in json.loads(out_json.read_text())["steps"]] == [0, 2, 3, 4]


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"", "is empty: the process ended before it wrote anything"),
        (b'{\n "schema": "vramscope.report/1"\n}\n', "is not a vramscope journal"),
        (b"#!/bin/sh\necho hello\n", "is not a vramscope journal"),
        (b'{"k":"journal","t":0,"schema":"vramscope.journal/2","fields":{}}\n', "newer vramscope"),
        (b'{"k":"journal","t":0,"schema":"vramscope.jou', "holds no whole line"),
    ],
    ids=["empty", "a-report", "a-shell-script", "newer", "cut-in-its-header"],
)
def test_a_file_that_is_not_a_journal_is_one_line_and_exit_2(tmp_path, capsys, content, said):
    path = tmp_path / "run.journal"
    path.write_bytes(content)
    with pytest.raises(JournalError, match=said):
        parse_journal(content, str(path))
    code, out, err = run_cli(["report", str(path)], capsys)
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("vramscope: error: ") and said in line


def test_a_journal_is_read_without_following_a_link(tmp_path):
    real = tmp_path / "real.journal"
    write_journal(real, steps=2)
    link = tmp_path / "link.journal"
    link.symlink_to(real)
    with pytest.raises(JournalError, match="cannot read"):
        read_journal(link)


# ---- how a process ended ----------------------------------------------------------------------


def kernel_files(root: Path, files: dict[str, str]) -> Path:
    """/proc and /sys/fs/cgroup files as the kernel lays them out, under ``root``."""
    for name, text in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return root


def test_the_oom_kill_counter_is_read_where_the_kernel_keeps_it(tmp_path):
    v2 = kernel_files(
        tmp_path / "v2",
        {
            "proc/self/cgroup": "0::/user.slice/job-7\n",
            "proc/vmstat": "pgfault 10\noom_kill 40\n",
            "cg/user.slice/job-7/memory.events": "low 0\nhigh 0\nmax 9\noom 3\noom_kill 2\n",
        },
    )
    counter = oom_kill_counter(v2 / "proc", v2 / "cg")
    assert (counter.count, counter.scope) == (2, "cgroup")
    v1 = kernel_files(
        tmp_path / "v1",
        {
            "proc/self/cgroup": "5:cpu,cpuacct:/job\n4:memory:/slurm/job-8\n0::/\n",
            "cg/memory/slurm/job-8/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n",
        },
    )
    assert oom_kill_counter(v1 / "proc", v1 / "cg").count == 7
    bare = kernel_files(
        tmp_path / "bare", {"proc/self/cgroup": "0::/\n", "proc/vmstat": "oom_kill 11\n"}
    )
    counter = oom_kill_counter(bare / "proc", bare / "cg")
    assert (counter.count, counter.scope) == (11, "machine")
    assert oom_kill_counter(tmp_path / "nothing", tmp_path / "nothing") is None


def test_how_a_process_ended_is_said_in_the_reports_words():
    oom = exit_info(Ending(signal=9, at=10.0, oom_kills=1, oom_scope="cgroup"), None, 0.2)
    assert (oom.status, oom.code, oom.signal, oom.signal_number) == ("killed", 137, "SIGKILL", 9)
    assert oom.killed_by == OOM_KILLER and oom.lost_seconds == 0.2 and oom.source == "journal"
    assert oom.error.startswith("killed by the kernel's OOM killer (SIGKILL, signal 9")
    other = exit_info(Ending(signal=9, oom_kills=0, oom_scope="cgroup"), None, None)
    assert other.killed_by is None and "another process sent it" in other.error
    crash = exit_info(Ending(signal=11), None, None)
    assert (crash.status, crash.code) == ("crashed", 139) and "segmentation fault" in crash.error
    left = exit_info(Ending(code=5), None, None)
    assert (left.status, left.code, left.signal) == ("error", 5, None)
    cuda = {"status": "error", "code": 1, "error": "AcceleratorError: CUDA error: an illegal "
            "memory access was encountered"}  # fmt: skip
    aborted = exit_info(Ending(signal=6), cuda, None, stopped=True)
    assert aborted.status == "crashed" and aborted.code == 134
    assert aborted.error.startswith("the script ended (error: AcceleratorError: CUDA error: an")
    assert aborted.error.endswith("while its report was written")
    by_hand = exit_info(None, None, None)
    assert by_hand.status == "unknown" and by_hand.source == "journal"


# ---- the signals run's parent passes on ------------------------------------------------------


def test_the_parent_passes_on_only_the_signals_the_script_did_not_get():
    sent: list[int] = []
    relay = _Relay(sent.append)
    term = signal.SIGTERM
    # `kill PID` reaches the parent alone: passed on once the child has not said it got it
    relay.got(0.0, [term])
    relay.decide(ACK_WAIT_S / 2)
    assert sent == []
    relay.decide(ACK_WAIT_S)
    assert sent == [term]
    relay.acknowledged(ACK_WAIT_S + 0.01, bytes([term]))  # the child got what was passed on
    assert relay.sent == [] and relay.direct == []
    # `timeout`, a scheduler or Ctrl-C reach the whole group: the child (and its two
    # workers) said so first, nothing is passed on
    relay.acknowledged(1.0, bytes([term, term, term]))
    relay.got(1.001, [term])
    relay.decide(1.0 + 2 * ACK_WAIT_S)
    assert sent == [term] and relay.direct == []
    # a second SIGTERM, to the parent alone, is a second one
    relay.got(1.5, [term])
    relay.decide(1.5 + ACK_WAIT_S)
    assert sent == [term, term]
    relay.acknowledged(2.0, bytes([REPORTED]))
    assert relay.reported
