"""Verdicts: path class and flags of one request, judged against the topology."""

from railtrace.verdicts.config import DEFAULT_EXPECTED_BANDWIDTH, VerdictConfig
from railtrace.verdicts.judge import judge, lane_transport, parse_lanes

__all__ = ["DEFAULT_EXPECTED_BANDWIDTH", "VerdictConfig", "judge", "lane_transport", "parse_lanes"]
