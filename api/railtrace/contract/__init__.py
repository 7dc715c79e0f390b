"""The topology contract audit: is topology discovered, preserved, verified and consumed, per pod?

`audit()` judges; `contract_gauges()` feeds `/metrics`; `filter_report()` serves
`GET /api/v1/contract`; `railtrace contract` (`cli.contract_command`) prints it.
"""

from railtrace.contract.audit import ContractConfig, audit, summary_dict
from railtrace.contract.online import ContractCache, audit_store, recent_summaries
from railtrace.contract.report import (
    OBLIGATIONS,
    STATUSES,
    ContractReport,
    Evidence,
    ObligationResult,
    Rollup,
    Subject,
    contract_gauges,
    filter_report,
    worst,
)

__all__ = [
    "OBLIGATIONS",
    "STATUSES",
    "ContractCache",
    "ContractConfig",
    "ContractReport",
    "Evidence",
    "ObligationResult",
    "Rollup",
    "Subject",
    "audit",
    "audit_store",
    "contract_gauges",
    "filter_report",
    "recent_summaries",
    "summary_dict",
    "worst",
]
