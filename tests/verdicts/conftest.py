"""The hand-described fleet (fleet.yaml) that verdict tests judge against."""

from __future__ import annotations

import pytest

from railtrace.topology import Topology, load_paths
from tests.verdicts.helpers import FLEET


@pytest.fixture(scope="session")
def fleet() -> Topology:
    return load_paths([FLEET])
