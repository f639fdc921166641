"""The fit's answer in one place: the verified batch size when real trials found one, else
the estimate's. Pure: reports saved before the ``answer`` key existed get it the same way."""

from __future__ import annotations

from typing import Any


def final_answer(section: dict[str, Any]) -> dict[str, Any]:
    """The fit's answer in one place: the verified batch size when real trials found one,
    else the estimate's (with the margin)."""
    verify = section.get("verify") or {}
    verified = verify.get("max_batch_size")
    if verified is not None:
        return {
            "max_batch_size": verified,
            "source": "verify",
            "real_trials": verify.get("real_trials", len(verify.get("trials") or [])),
            "margin_applied": False,  # trials run at the full target: they are the truth
        }
    return {
        "max_batch_size": section.get("max_batch_size"),
        "source": "estimate",
        "real_trials": 0,
        "margin_applied": True,
    }
