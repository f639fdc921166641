"""IPython and Jupyter: ``%load_ext vramscope`` and the ``%%vramscope`` cell magic."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from vramscope.errors import VramscopeError


@magics_class
class VramscopeMagics(Magics):
    """``%%vramscope``: track the memory of one cell and show its report."""

    @magic_arguments()
    @argument(
        "--detail",
        choices=("default", "modules"),
        default="default",
        help="modules: add the module tree and the categories at the peak per module",
    )
    @argument("--depth", type=int, default=3, help="module tree depth (with --detail modules)")
    @argument("--json", metavar="PATH", help="also save the report as JSON")
    @argument("--html", metavar="PATH", help="also save the full HTML report")
    @argument(
        "--journal",
        metavar="PATH",
        help="write the cell's journal to PATH (kept); by default NAME.journal beside --json "
        "NAME.json, else the private directory, removed once the report is made",
    )
    @argument("--no-journal", action="store_true", help="write no journal")
    @argument(
        "-o", "--output", action="store_true", help="return the Report (the cell's Out) instead"
    )
    @argument("-q", "--quiet", action="store_true", help="show nothing (files are still written)")
    @cell_magic
    def vramscope(self, line: str, cell: str) -> Any:
        """Track the memory of this cell: peak, what it is made of, steps, findings.

        In a notebook the report shows as a short table (``--html PATH`` writes the full
        page), in a terminal as the terminal report. The cell's journal is written as it
        runs: when the kernel dies (the OOM killer, a segfault), ``vramscope report --list``
        lists it and ``vramscope report JOURNAL`` makes the cell's report.
        """
        from vramscope.journal import files
        from vramscope.tracking.session import Session

        options = parse_argstring(self.vramscope, line)
        if options.no_journal and options.journal:
            raise UsageError("give --journal PATH or --no-journal, not both")
        journal: Any = True  # the private directory, removed when the session stops
        beside = None  # beside --json: removed once the report is written
        if options.no_journal:
            journal = None
        elif options.journal:
            journal = options.journal
        elif options.json:
            journal = beside = files.beside(options.json)
        try:
            session = Session(
                name="notebook cell",
                workload={"spec": "notebook cell"},
                detail=options.detail,
                depth=options.depth,
                journal=journal,
            )
        except VramscopeError as exc:
            raise UsageError(str(exc)) from None
        hook = self.shell.displayhook
        outer = getattr(hook, "exec_result", None)  # the nested run_cell would clear it
        session.start()
        try:
            result = self.shell.run_cell(cell, store_history=False)
        finally:
            session.stop()
            hook.exec_result = outer
        error = result.error_before_exec or result.error_in_exec
        if error is not None:
            session.record_exception(error)
        report = session.report()
        writers = ((options.json, report.save), (options.html, lambda p: _write_html(report, p)))
        for path, write in writers:
            if path:
                try:
                    write(path)
                except OSError as exc:
                    raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
        if beside is not None:
            files.remove(beside)  # the report holds everything it held
        if options.output:
            return report
        if not options.quiet:
            self._show(report)
        return None

    def _show(self, report: Any) -> None:
        from IPython.display import display
        from IPython.terminal.interactiveshell import TerminalInteractiveShell

        if isinstance(self.shell, TerminalInteractiveShell):
            from vramscope.report.terminal import print_report

            print_report(report)
        else:
            display(report)


def _write_html(report: Any, path: str) -> None:
    from vramscope.report.html import write

    write(report, path)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext vramscope``: register ``%%vramscope``."""
    ipython.register_magics(VramscopeMagics)
