"""A torchrun job gives one report with a row per rank: real jobs of 2 and 3 ranks on the
CPU (gloo, DDP), started with torchrun and with `vramscope run --nproc`, one rank heavier,
one failing, one hanging; and the pieces they rest on (launch variables, the private rank
directory, the joining of rows) checked on their own."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from vramscope import schema
from vramscope.cli.main import main
from vramscope.distributed import exchange, gather
from vramscope.distributed.launch import torchrun_command
from vramscope.distributed.rank import RankInfo, job_key
from vramscope.errors import VramscopeError
from vramscope.report.model import Peak, RankEntry, RankExit, Report

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "ddp_ranks.py"
MIB = 2**20
# the script's model: Linear(64, 256), Linear(256, 256), Linear(256, 8) in float32
PARAMETER_BYTES = 4 * ((64 * 256 + 256) + (256 * 256 + 256) + (256 * 8 + 8))

pytestmark = [
    pytest.mark.skipif(sys.platform == "win32", reason="torchrun jobs on POSIX"),
    # one worker runs this module (`--dist loadgroup`): the job of 3 ranks runs once
    pytest.mark.xdist_group("distributed"),
]


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="80")
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def vramscope(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "vramscope", *args], cwd)


def torchrun(nproc: int, options: list[str], script_args: list[str], cwd: Path):
    """``torchrun --standalone --nproc-per-node N -m vramscope run OPTIONS ddp_ranks.py ARGS``."""
    return run(torchrun_command(nproc, options, str(SCRIPT), script_args), cwd)


def load(path: Path) -> tuple[dict, Report]:
    data = json.loads(path.read_text())
    assert schema.errors(data) == []
    return data, Report.from_dict(data)


# ---- a job of 3 ranks, rank 2 holding 160 MiB more, the process group left alive ---------


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("three")
    proc = torchrun(
        3, ["--json", "job.json", "--html", "job.html"], ["--heavy-rank", "2", "--keep-group"], out
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, out


def test_a_job_gives_one_report_with_a_row_per_rank(three_ranks):
    proc, out = three_ranks
    data, report = load(out / "job.json")
    assert [r.rank for r in report.ranks] == [0, 1, 2]
    assert [r.local_rank for r in report.ranks] == [0, 1, 2]
    host = socket.gethostname()
    for row in report.ranks:
        assert row.reported and row.host == host and row.exit.status == "ok"
        assert row.exit.code == 0 and row.steps == 3 and row.pid
        assert row.categories_at_peak.parameters == PARAMETER_BYTES
        assert row.categories_at_peak.gradients == PARAMETER_BYTES
        assert row.categories_at_peak.optimizer_state == 2 * PARAMETER_BYTES + 6 * 4  # + steps
    assert set(data["ranks"][0]) >= {"rank", "host", "peak", "categories_at_peak", "exit"}
    assert data["distributed"]["world_size"] == 3 and data["distributed"]["backend"] == "gloo"
    assert report.exit.status == "ok" and report.exit.code == 0
    assert proc.stdout.count("Ranks: 3 of 3 reported") == 1  # only rank 0 prints


def test_the_top_level_peak_is_the_heaviest_ranks(three_ranks):
    _, out = three_ranks
    data, report = load(out / "job.json")
    rss = {r.rank: r.peak.host_rss_bytes for r in report.ranks}
    assert max(rss, key=rss.get) == 2
    assert data["distributed"]["heaviest_rank"] == 2
    assert data["distributed"]["rank"] == 2  # the rest of the report is rank 2's own
    assert report.peak.host_rss_bytes == rss[2]
    own = Report.load(out / "job.ranks" / "rank-2.json")
    assert own.peak.host_rss_bytes == rss[2] and own.steps == report.steps


def test_the_imbalance_names_the_heavier_rank(three_ranks):
    _, out = three_ranks
    data, report = load(out / "job.json")
    spread = data["distributed"]["imbalance"]
    rss = {r.rank: r.peak.host_rss_bytes for r in report.ranks}
    assert spread["by"] == "host_rss_bytes" and spread["heaviest_rank"] == 2
    assert spread["max_bytes"] == rss[2] and spread["min_bytes"] == min(rss.values())
    assert spread["spread_bytes"] == rss[2] - min(rss.values()) > 80 * MIB  # 160 MiB kept
    assert spread["max_over_min"] == pytest.approx(rss[2] / min(rss.values()), abs=1e-4)
    found = [f for f in report.findings if f.kind == "rank_imbalance"]
    assert len(found) == 1 and found[0].message.startswith("rank 2 is the heaviest")


def test_ddp_gradient_buckets_are_named_exactly(three_ranks):
    _, out = three_ranks
    _, report = load(out / "job.json")
    for row in report.ranks:
        (buckets,) = [m for m in row.memory if m["name"] == "ddp_gradient_buckets"]
        assert buckets["bytes"] == sum(buckets["bucket_sizes"]) == PARAMETER_BYTES
        assert buckets["gradient_as_bucket_view"] is False
        assert buckets["category"] is None  # on the CPU 'other' is not measured


def test_rank_0_gathered_through_the_process_group_within_a_second(three_ranks):
    _, out = three_ranks
    data, _ = load(out / "job.json")
    gathered = data["distributed"]["gather"]
    assert "process group store" in gathered["via"] and gathered["missing"] == []
    assert gathered["seconds"] < 1.0
    folder = out / "job.ranks"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["rank-0.json", "rank-1.json", "rank-2.json"]  # no hello, no temporary
    for rank, name in enumerate(files):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600
        assert Report.load(folder / name).extra["distributed"]["rank"] == rank


def test_the_terminal_shows_the_ranks_side_by_side_in_80_columns(three_ranks):
    _, out = three_ranks
    proc = vramscope("report", "job.json", cwd=out)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    start = next(i for i, line in enumerate(lines) if "Ranks: 3 of 3 reported" in line)
    rows = [line.split() for line in lines[start : start + 8] if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["0", "1", "2"]
    assert "heaviest" in " ".join(rows[2]) and "heaviest" not in " ".join(rows[0] + rows[1])
    assert any(line.startswith("Imbalance (peak host RSS): heaviest rank 2") for line in lines)


def test_the_html_report_has_a_ranks_section_with_text_escaped(three_ranks):
    _, out = three_ranks
    page = (out / "job.html").read_text()
    assert 'id="ranks"' in page and 'id="chart-ranks"' in page
    assert "<td>heaviest</td>" in page.replace('<td class="l">heaviest</td>', "<td>heaviest</td>")
    from vramscope.report import html

    report = Report.load(out / "job.json")
    report.ranks[1].host = "<script>alert(1)</script>"
    escaped = html.render(report)
    assert "<script>alert(1)</script>" not in escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in escaped


# ---- failing and hanging ranks -------------------------------------------------------------


def test_a_failing_rank_leaves_its_row_and_the_job_keeps_its_exit_code(tmp_path):
    proc = vramscope(
        "run", "--nproc", "2", "-q", "--json", "job.json", str(SCRIPT), "--fail-rank", "1",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr[-3000:]  # rank 1's sys.exit(3), not torchrun's 1
    assert "rank 1: " in proc.stderr and "exited with code 3" in proc.stderr
    _, report = load(tmp_path / "job.json")
    failed = report.ranks[1]
    assert failed.reported and failed.exit.status == "error" and failed.exit.code == 3
    assert failed.steps == 2  # its partial report: the steps before it gave up
    assert report.ranks[0].reported and report.ranks[0].exit.status != "ok"  # stopped after
    assert report.exit.code == 3 and report.exit.error == "rank 1: exited with 3"
    assert any(f.kind == "rank_failed" and f.data["rank"] == 1 for f in report.findings)


def test_a_killed_rank_is_in_the_jobs_report_with_what_its_journal_holds(tmp_path):
    proc = vramscope(
        "run", "--nproc", "2", "-q", "--json", "job.json", str(SCRIPT), "--kill-rank", "1",
        "--steps", "4", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stderr[-3000:]
    _, report = load(tmp_path / "job.json")
    killed = report.ranks[1]
    assert not killed.reported and killed.exit.status == "lost" and killed.source == "journal"
    assert "its row is made from its journal" in killed.exit.error
    assert killed.steps >= 1 and killed.peak.host_rss_bytes > 32 * MIB
    assert killed.categories_at_peak.parameters == PARAMETER_BYTES
    assert killed.report_file == str(Path("job.ranks") / "rank-1.journal")  # kept
    found = [f for f in report.findings if f.kind == "rank_missing"]
    assert len(found) == 1 and "its row is empty" not in found[0].message
    again = vramscope("report", "-q", "--json", "rank1.json", killed.report_file, cwd=tmp_path)
    assert again.returncode == 0, again.stderr  # the journal, read by hand
    assert json.loads((tmp_path / "rank1.json").read_text())["steps"]


def test_a_killed_rank_0_leaves_the_jobs_report_made_from_the_ranks_files(tmp_path):
    proc = vramscope(
        "run", "--nproc", "2", "-q", "--json", "job.json", str(SCRIPT), "--kill-rank", "0",
        "--steps", "4", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "rank 0 ended without the job's report" in proc.stderr, proc.stderr[-3000:]
    _, report = load(tmp_path / "job.json")
    first, second = report.ranks
    assert first.source == "journal" and first.exit.status == "lost" and first.steps >= 1
    assert first.categories_at_peak.parameters == PARAMETER_BYTES
    assert second.reported and second.exit.status != "ok"  # stopped once rank 0 died


def test_a_hanging_rank_is_marked_timed_out_and_its_row_is_read_from_its_journal(tmp_path):
    done = tmp_path / "job.json"  # the hanging rank waits until the job's report exists
    proc = torchrun(
        2,
        ["-q", "--gather-timeout", "2", "--gather-via", "files", "--json", "job.json"],
        ["--hang-rank", "1", "--hang-until", str(done)],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data, report = load(done)
    hung = report.ranks[1]
    assert not hung.reported and hung.exit.status == "timed_out" and hung.exit.code is None
    assert hung.host == socket.gethostname() and hung.pid  # from its hello at the start
    # what the hanging rank's journal held when rank 0 gave up waiting: its steps so far
    assert hung.source == "journal" and hung.steps >= 2
    assert hung.peak.host_rss_bytes > 32 * MIB and hung.peak.allocated_bytes is None
    assert hung.categories_at_peak.parameters == PARAMETER_BYTES
    assert "its row is made from its journal" in hung.exit.error
    # once it stopped hanging, rank 1 wrote its report, and removed its journal
    assert sorted(p.name for p in (tmp_path / "job.ranks").iterdir()) == [
        "rank-0.json",
        "rank-1.json",
    ]
    assert report.ranks[0].reported and report.ranks[0].exit.status == "ok"
    gathered = data["distributed"]["gather"]
    assert gathered["missing"] == [1] and gathered["via"] == []
    assert 2.0 <= gathered["waited_s"] < 4.0
    assert report.exit.status == "incomplete" and report.exit.code == 0
    assert any(f.kind == "rank_missing" for f in report.findings)


# ---- the pieces, on their own ----------------------------------------------------------------


def test_the_launch_variables_say_which_rank_this_is():
    env = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "node-a",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RUN_ID": "run/1 x",
        "TORCHELASTIC_RESTART_COUNT": "2",
    }
    info = RankInfo.from_env(env)
    assert info is not None
    assert (info.rank, info.world_size, info.local_rank, info.node_rank) == (3, 4, 1, 1)
    assert info.agent_store == ("node-a", 29500)
    assert info.job == "run_1_x-attempt2-port29500"
    assert RankInfo.from_env({}) is None
    assert RankInfo.from_env({"RANK": "4", "WORLD_SIZE": "4"}) is None
    assert RankInfo.from_env({"RANK": "x", "WORLD_SIZE": "2"}) is None
    assert RankInfo.from_env({"RANK": "0", "WORLD_SIZE": "2"}).agent_store is None
    assert job_key({"SLURM_JOB_ID": "77"}) == "77-attempt0"


def test_the_rank_directory_is_private_and_never_follows_a_link(tmp_path):
    folder = exchange.PrivateDir(tmp_path / "job.ranks")
    assert stat.S_IMODE(os.stat(tmp_path / "job.ranks").st_mode) == 0o700
    written = folder.write("rank-0.json", b"{}")
    assert stat.S_IMODE(written.stat().st_mode) == 0o600 and folder.read("rank-0.json") == b"{}"
    secret = tmp_path / "secret"
    secret.write_text("not for vramscope")
    os.symlink(secret, tmp_path / "job.ranks" / "rank-1.json")
    assert folder.read("rank-1.json") is None  # a link is not read
    folder.write("rank-1.json", b"[]")  # replaces the link itself, not its target
    assert secret.read_text() == "not for vramscope"
    assert not (tmp_path / "job.ranks" / "rank-1.json").is_symlink()
    folder.close()
    os.symlink(tmp_path / "job.ranks", tmp_path / "linked.ranks")
    with pytest.raises(exchange.UnsafeDirectory):
        exchange.PrivateDir(tmp_path / "linked.ranks")
    shared = tmp_path / "shared.ranks"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    with pytest.raises(exchange.UnsafeDirectory, match="not a private directory"):
        exchange.PrivateDir(shared)


def _row(rank: int, rss: int | None, status: str = "ok", code: int | None = 0, **kw) -> RankEntry:
    return RankEntry(
        rank=rank,
        host="h",
        peak=Peak(host_rss_bytes=rss, **kw),
        exit=RankExit(status=status, code=code),
        reported=status not in ("timed_out", "lost"),
    )


def test_the_job_exit_is_the_first_rank_that_failed_on_its_own():
    rows = [_row(0, 10, "terminated", 143), _row(1, 10, "error", 3), _row(2, 10)]
    rows[0].ended_at, rows[1].ended_at = "2026-01-01T00:00:02", "2026-01-01T00:00:01"
    assert gather.job_exit(rows).code == 3
    assert gather.job_exit(rows).error == "rank 1: exited with 3"
    only_stopped = [_row(0, 10, "terminated", 143), _row(1, 10)]
    assert gather.job_exit(only_stopped).status == "terminated"
    missing = [_row(0, 10), _row(1, None, "timed_out", None)]
    assert gather.job_exit(missing).status == "incomplete"
    assert gather.job_exit([_row(0, 10)]).status == "ok"


def test_ranks_are_weighed_by_peak_allocated_when_a_rank_used_cuda():
    rows = [_row(0, 900, allocated_bytes=200), _row(1, 100, allocated_bytes=300)]
    assert gather.measure_of(rows) == "peak_allocated_bytes"
    assert gather.heaviest(rows, "peak_allocated_bytes").rank == 1
    spread = gather.imbalance(rows, "peak_allocated_bytes")
    assert spread["max_over_min"] == 1.5 and spread["spread_bytes"] == 100
    assert gather.imbalance([_row(0, None, "lost", None)], "host_rss_bytes") is None


def test_a_row_from_a_rank_is_checked_like_a_report():
    good = gather.row_to_dict(_row(1, 10))
    assert gather.row_from_dict(good, 1) == _row(1, 10)
    with pytest.raises(VramscopeError, match=r"ranks\[1\].peak.host_rss_bytes"):
        gather.row_from_dict({**good, "peak": {"host_rss_bytes": "lots"}}, 1)
    with pytest.raises(VramscopeError, match=r"ranks\[1\].reported"):
        gather.row_from_dict({**good, "reported": "yes"}, 1)


def test_a_report_without_ranks_still_loads():
    data = json.loads((ROOT / "tests" / "data" / "report_h200_gpt.json").read_text())
    assert "ranks" not in data
    assert Report.from_dict(data).ranks == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nproc", "0", "x.py"], "Invalid value for '--nproc'"),
        (["--nproc", "2", "missing.py"], "no such script: missing.py"),
        (["--gather-timeout", "-1", "x.py"], "Invalid value for '--gather-timeout'"),
        (["--gather-via", "pigeon", "x.py"], "Invalid value for '--gather-via'"),
    ],
)
def test_bad_distributed_options_are_one_line_and_exit_code_2(
    tmp_path, monkeypatch, capsys, args, message
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as ended:
        main(["run", *args])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_ranks_measured_on_a_gpu_are_weighed_by_allocated_and_fit_80_columns():
    """Two reports recorded on an H200 as the ranks of one job: the heavier by peak
    allocated is on top, the ranks table takes its narrow layout in 80 columns."""
    from rich.console import Console

    from vramscope.report import html
    from vramscope.report.terminal import render

    reports = [Report.load(ROOT / "tests" / "data" / n) for n in RECORDED]
    for rank, report in enumerate(reports):
        report.extra["distributed"] = {"rank": rank, "host": f"node-{rank}", "job": "j"}
    rows = [gather.row_of(r) for r in reports]
    job = gather.job_report(reports[1], rows, {"via": ["files"], "seconds": 0.1}, 2)
    assert job.extra["distributed"]["heaviest_rank"] == 0  # 774 MiB against 102 MiB
    assert job.peak.allocated_bytes == reports[0].peak.allocated_bytes
    assert job.categories_at_peak == reports[0].categories_at_peak
    assert "rank 0's (the heaviest)" in job.categories_note
    assert schema.errors(json.loads(job.to_json())) == []
    console = Console(width=80, record=True, color_system=None)
    console.print(render(job))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    table = [line.split() for line in lines if line.strip().startswith(("0 ◀", "1 "))]
    assert table[0][:4] == ["0", "◀", "node-0", "774.47"] and table[1][:2] == ["1", "node-1"]
    assert 'class="hl"' in html.render(job)


RECORDED = ("report_h200_gpt.json", "report_h200_leak.json")


def test_a_script_that_destroyed_its_own_group_still_lets_the_collectives_settle(tmp_path):
    """A single process that set up its own group (no launcher) and destroyed it before the
    end still holds it through its DDP model: the runner waits before the script's objects go
    (a gloo teardown with the GIL held can hang otherwise); a run without one does not wait."""
    import time

    from vramscope.tracking import runner
    from vramscope.tracking.session import Session

    script = tmp_path / "own_group.py"
    script.write_text(
        "import os, socket, time, torch, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "with socket.socket() as s:\n"
        "    s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]\n"
        "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))\n"
        "dist.init_process_group('gloo', rank=0, world_size=1)\n"
        "model = DDP(torch.nn.Linear(8, 8))\n"
        "model(torch.randn(4, 8)).sum().backward()\n"
        "dist.destroy_process_group()\n"
        "start = time.perf_counter()\n"
    )
    plain = tmp_path / "plain.py"
    plain.write_text("import time, torch\nstart = time.perf_counter()\ntorch.nn.Linear(8, 8)\n")
    waits = {}
    original = runner._let_collectives_settle

    def timed(session: Session) -> None:
        began = time.perf_counter()
        original(session)
        waits[len(waits)] = (time.perf_counter() - began, session.holds_process_groups())

    runner._let_collectives_settle = timed
    try:
        for path in (script, plain):
            _, code = runner.run_script(path, [], Session(device="cpu", status=False))
            assert code == 0
    finally:
        runner._let_collectives_settle = original
    assert "RANK" not in os.environ
    (group_wait, held), (plain_wait, none_held) = waits[0], waits[1]
    assert held and group_wait >= runner.SETTLE_S
    assert not none_held and plain_wait < runner.SETTLE_S / 2


def test_a_script_that_trains_in_spawned_processes_says_so(tmp_path):
    """``torch.multiprocessing.spawn`` trains in fresh interpreters this run cannot see: the
    report (of the process that started them) says how many, which function, and how to
    measure each rank; the spawn itself is torch's own (the ranks train and exit 0)."""
    script = tmp_path / "spawned.py"
    script.write_text(
        "import os, socket, torch, torch.distributed as dist, torch.multiprocessing as mp\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\n"
        "def train(rank, world, port):\n"
        "    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))\n"
        "    dist.init_process_group('gloo', rank=rank, world_size=world)\n"
        "    model = DDP(torch.nn.Linear(8, 8))\n"
        "    model(torch.randn(4, 8)).sum().backward()\n"
        "    dist.destroy_process_group()\n"
        "if __name__ == '__main__':\n"
        "    with socket.socket() as s:\n"
        "        s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]\n"
        "    mp.spawn(train, args=(2, port), nprocs=2)\n"
    )
    proc = vramscope("run", "--json", "spawned.json", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data, _ = load(tmp_path / "spawned.json")
    finding = next(f for f in data["findings"] if f["kind"] == "spawned_processes")
    assert finding["severity"] == "warning"
    assert finding["data"]["spawns"] == [{"function": "train", "processes": 2}]
    assert "vramscope run --nproc N" in finding["message"]
