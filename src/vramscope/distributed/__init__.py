"""Distributed runs under torchrun: each rank tracks itself, rank 0 gathers one report.

``rank`` reads what the launcher says about this process; ``memory`` names the memory
DDP and FSDP add; ``exchange`` moves each rank's report to rank 0 (the job's store, or
files in a private directory); ``gather`` joins the reports into one (pure functions);
``job`` runs those steps at the end of a rank; ``launch`` is ``vramscope run --nproc``.
"""
