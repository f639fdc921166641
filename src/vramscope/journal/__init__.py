"""The run's journal: its record, written as it goes, from which a report is made when the
process dies before it could write one.

``format`` says what a line holds; ``files`` where journals live and how they are written
(private, never through a symbolic link); ``writer`` appends a tracking Session's steps,
peaks and samples as the run goes; ``reader`` reads a journal back, as much of it as is
intact; ``ending`` names how a process ended (a signal, the kernel's OOM killer, an exit
without a report); ``rebuild`` makes the Report; ``supervise`` is ``vramscope run``'s
parent process, which waits for the script's process and makes the report when it died.
No torch in the reading half: a report is made from a journal anywhere.
"""
