"""Schemathesis's stateful runs over the API: the OpenAPI links of the schema (from what a create
operation made to the operations that read it or act on it) walked by a hypothesis state
machine, a seller and a buyer taking turns, every answer held to the checks of
``test_schema.py``; the run must have followed links, and the invariants hold after it, and
again once every deadline has passed.

As in ``test_schema.py`` the app runs on the test's event loop (:class:`OnLoop`) while
hypothesis runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Coroutine
from datetime import timedelta
from decimal import Decimal
from typing import Any, TypeVar

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, initialize, run_state_machine_as_test
from schemathesis import Case
from schemathesis.core.transport import Response
from schemathesis.generation.stateful.state_machine import StepInput, StepOutput
from sqlalchemy import delete, insert, select

from dueflow.api.app import LINKS, create_app
from dueflow.payments.base import VerifiedPayment
from dueflow.service import orders, report
from dueflow.service import payments as payment_service
from dueflow.service.deps import Deps
from dueflow.store.schema import metadata
from tests.unit.api import Api, running_api
from tests.unit.api.test_schema import CHECKS, OnLoop

T = TypeVar("T")

#: Scenarios and steps per scenario, per scope: the file runs in about half a minute.
SCENARIOS = 50
STEPS = 20

#: The links of the schema only (schemathesis infers more by default); valid input only (the
#: invalid is test_schema.py's, and schemathesis would drop the bearer token from most steps).
CONFIG = schemathesis.Config.from_dict(
    {"phases": {"stateful": {"inference": {"algorithms": []}, "generation": {"mode": "positive"}}}}
)

#: What each run covers (by path), and whether its scenarios start from a valid show, coupon
#: template and flash sale.
SCOPES = {
    "marketplace": (r"^/api/(goods|orders)", False),
    "shows and shop": (r"^/api/(shows|skus|coupon-templates|flash-sales|orders)", True),
}

#: Who calls what: the seller makes goods, shows, SKUs, coupons and sales and ships; the buyer
#: orders, pays and confirms receipt; both take turns at everything else (reads, cancels,
#: reviews), each answered as that party.
SELLER_DOES = {
    "POST /api/goods",
    "POST /api/shows",
    "POST /api/shows/{show_id}/cancel",
    "POST /api/skus",
    "POST /api/skus/{sku_id}/restock",
    "POST /api/coupon-templates",
    "POST /api/coupon-templates/{template_id}/issue",
    "POST /api/flash-sales",
    "POST /api/orders/{order_id}/ship",
}
BUYER_DOES = {
    "POST /api/orders",
    "POST /api/orders/{order_id}/payments",
    "POST /api/orders/{order_id}/confirm-receipt",
}
PAY = "POST /api/orders/{order_id}/payments"


@pytest.fixture
async def api(world) -> AsyncIterator[Api]:
    """The API's client over the world's deps, with a seller's and a buyer's token."""
    async with running_api(world.deps) as api:
        yield api


def test_the_links_are_valid_openapi_and_lead_to_real_operations() -> None:
    """The schema with its links validates against the OpenAPI 3 schema, and every link names
    an operation and parameters that exist (building the state machine resolves each one)."""
    spec = create_app(None).openapi()  # type: ignore[arg-type]  # the schema reads no deps
    loaded = schemathesis.openapi.from_dict(spec, config=CONFIG)
    loaded.validate()
    loaded.as_state_machine()
    documented = {
        (method, path): answer["links"]
        for path, item in spec["paths"].items()
        for method, op in item.items()
        for answer in op["responses"].values()
        if "links" in answer
    }
    assert documented == LINKS
    assert loaded.statistic.transitions.total == sum(len(links) for links in LINKS.values())


class Run:
    """What one stateful run did: calls that used a value taken by a link, by link, and how
    many of those succeeded."""

    def __init__(self) -> None:
        self.followed: Counter[str] = Counter()
        self.succeeded: Counter[str] = Counter()


def machine(
    schema: Any, api: Api, loop: asyncio.AbstractEventLoop, run: Run, *, seeded: bool
) -> type:
    """The schema's state machine, calling as the seller or the buyer (:data:`SELLER_DOES`,
    :data:`BUYER_DOES`, turns for the rest), checking each answer with ``CHECKS`` and playing
    the provider's notification for each payment started. ``seeded``: every scenario starts
    with a valid show, coupon template and flash sale (their times are hard to generate), whose
    answers its links then lead on from."""

    def on_loop(coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    now = api.deps.clock.now()
    window = {"starts_at": now.isoformat(), "ends_at": (now + timedelta(hours=1)).isoformat()}
    caught = Bundle("catch_all")  # schemathesis files each answer by its own matchers
    start = on_loop(rows_of(api.deps))

    class Machine(schema.as_state_machine()):  # type: ignore[misc]
        def setup(self) -> None:
            """Every scenario starts from the seeded database: what one scenario answers must
            not hang on what an earlier one left (an id it did not make, a seat another took),
            or hypothesis, replaying a scenario's first steps, sees it draw otherwise and
            calls the strategy flaky."""
            self.turn = 0
            on_loop(put_back(api.deps, start))

        def get_call_kwargs(self, case: Case) -> dict[str, Any]:
            label = case.operation.label
            if label in SELLER_DOES:
                who = "seller"
            elif label in BUYER_DOES:
                who = "buyer"
            else:
                self.turn += 1
                who = ("seller", "buyer")[self.turn % 2]
            if case.headers and "Idempotency-Key" in case.headers:
                # A key of its own for every call: a generated key met again in a later
                # scenario would answer that scenario's first call (or 409) from the state
                # the earlier one left, and the links feeding the next steps would change
                # from one run of a scenario to the next (hypothesis: a flaky strategy).
                case.headers["Idempotency-Key"] = uuid.uuid4().hex
            return {"headers": api.auth(who)}

        def step(self, input: StepInput) -> StepOutput:
            output = super().step(input)
            if input.transition is not None and input.applied_parameters:
                run.followed[input.transition.id] += 1
                if output.response.status_code < 300:
                    run.succeeded[input.transition.id] += 1
            return output

        def after_call(self, response: Response, case: Case) -> None:
            super().after_call(response, case)
            if case.operation.label == PAY and response.status_code == 201:
                order_id = case.path_parameters["order_id"]
                amount = Decimal(on_loop(orders.order_view(api.deps, order_id))["amount"])
                paid = VerifiedPayment(pay_no=response.json()["pay_no"], amount=amount)
                on_loop(payment_service.confirm_payment(api.deps, paid, actor="fakepay"))

        def validate_response(
            self, response: Response, case: Case, additional_checks: Any = None, **kwargs: Any
        ) -> None:
            case.validate_response(
                response,
                checks=CHECKS,
                transport_kwargs=kwargs or None,
                recorder=self.recorder,
            )

    if not seeded:
        return Machine

    class Seeded(Machine):
        def create(self, path: str, body: dict[str, Any]) -> StepOutput:
            """A valid ``POST path`` as a scenario's first steps, recorded as schemathesis's
            own rules record theirs (the links it follows name it as their parent)."""
            case = schema[path]["POST"].Case(body=body, media_type="application/json")
            self.recorder.record_case(case=case)
            self.control.record_step(StepInput.initial(case), self.recorder)
            output = self.step(StepInput.initial(case))
            assert output.response.status_code == 201, output.response.text
            return output

        @initialize(target=caught)
        def a_show(self) -> StepOutput:
            body = {
                "title": "Winter concert",
                "venue": "Hall 1",
                "starts_at": (now + timedelta(days=30)).isoformat(),
                "sales_close_at": (now + timedelta(days=29)).isoformat(),
                "seats": [{"label": f"A-{n}", "price": "80.00"} for n in range(1, 9)],
            }
            return self.create("/api/shows", body)

        @initialize(target=caught)
        def a_coupon_template(self) -> StepOutput:
            body = {
                "title": "5 off",
                "amount_off": "5.00",
                "valid_from": now.isoformat(),
                "valid_until": (now + timedelta(days=30)).isoformat(),
                "total": 3,
            }
            return self.create("/api/coupon-templates", body)

        @initialize(target=caught)
        def a_flash_sale(self) -> StepOutput:
            sku = self.create("/api/skus", {"title": "mug", "price": "25.00", "stock": 5})
            body = {"sku_id": sku.response.json()["id"], "price": "9.90", "stock": 3, **window}
            return self.create("/api/flash-sales", body)

    return Seeded


async def rows_of(deps: Deps) -> dict[str, list[dict[str, Any]]]:
    """Every row of every table (SQLite gives the next row the largest id + 1: no counters)."""
    found: dict[str, list[dict[str, Any]]] = {}
    async with deps.db.read() as conn:
        for table in metadata.sorted_tables:
            found[table.name] = [dict(r._mapping) for r in await conn.execute(select(table))]
    return found


async def put_back(deps: Deps, rows: dict[str, list[dict[str, Any]]]) -> None:
    """The database as :func:`rows_of` read it."""
    async with deps.db.write() as conn:
        for table in reversed(metadata.sorted_tables):
            await conn.execute(delete(table))
        for table in metadata.sorted_tables:
            if rows[table.name]:
                await conn.execute(insert(table), rows[table.name])


def whole_bodies(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with the links that place an order marked as giving its whole body (an order
    buys one kind of thing), which schemathesis would otherwise merge into a generated body
    that buys another kind too."""
    for item in spec["paths"].values():
        for op in item.values():
            for answer in op["responses"].values():
                for link in answer.get("links", {}).values():
                    if link["operationRef"] == "#/paths/~1api~1orders/post":
                        link["x-schemathesis"] = {"merge_body": False}
    return spec


@pytest.mark.parametrize("scope", SCOPES)
async def test_stateful_runs_follow_the_links_and_keep_to_the_schema(api, world, scope) -> None:
    paths, seeded = SCOPES[scope]
    loop = asyncio.get_running_loop()
    app = create_app(api.deps)
    run = Run()

    def play() -> None:
        schema = schemathesis.openapi.from_dict(
            whole_bodies(copy.deepcopy(app.openapi())), config=CONFIG
        ).include(path_regex=paths)
        schema.app = OnLoop(app, loop)

        @schema.hook
        def before_generate_body(context: Any, strategy: st.SearchStrategy) -> st.SearchStrategy:
            """Payments through the provider the test has, half the time (a generated name is
            almost never one)."""
            if context.operation is None or context.operation.label != PAY:
                return strategy
            return st.one_of(strategy, st.just({"provider": "fakepay"}))

        run_state_machine_as_test(
            machine(schema, api, loop, run, seeded=seeded),
            settings=settings(
                max_examples=SCENARIOS,
                stateful_step_count=STEPS,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            ),
        )

    await asyncio.to_thread(play)
    assert sum(run.followed.values()) > 0, "no call used a value a link took from an answer"
    placed = [link for link in run.succeeded if link.endswith("-> POST /api/orders")]
    assert placed, f"no order placed from a link: {run.followed}"
    assert (await report.check_invariants(api.deps)).ok
    for _ in range(5):  # every deadline passes, the worker acts on each in turn
        world.clock.advance(timedelta(days=10))
        await world.worker.drain()
    invariants = await report.check_invariants(api.deps)
    assert invariants.ok, invariants
