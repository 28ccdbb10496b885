"""The simulator fixtures the payment tests share: a fresh simulator per test on a FakeClock,
notifying a recording receiver. A module changes the simulator's settings by overriding
``sim_overrides``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from dueflow.clock import FakeClock
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator import app as simulator_app
from tests.unit.payments.test_simulator_alipay import Receiver, sim_client, sim_config


@pytest.fixture(scope="module")
def base_config() -> SimulatorConfig:
    return SimulatorConfig.generate()


@pytest.fixture
def receiver() -> Receiver:
    return Receiver()


@pytest.fixture
def sim_overrides() -> dict[str, Any]:
    return {}


@pytest.fixture
def config(
    base_config: SimulatorConfig, receiver: Receiver, sim_overrides: dict[str, Any]
) -> SimulatorConfig:
    return sim_config(base_config, receiver, **sim_overrides)


@pytest.fixture
def clock(config: SimulatorConfig) -> FakeClock:
    assert isinstance(config.clock, FakeClock)
    return config.clock


@pytest.fixture
def app(config: SimulatorConfig) -> FastAPI:
    return simulator_app.create_app(config)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the simulator (its control API among the rest)."""
    async with sim_client(app) as client:
        yield client
