"""The machinery every flow's model test shares (tests/unit/test_model_property.py for the
marketplace, test_tickets_model.py, test_shop_model.py): a flow adds its model, its world and
its people's rules; this module runs them.

:class:`ModelMachine` gives each hypothesis example two copies of the migrated template
database (the one under test and a shadow to drain), a FakeClock and a RecordingNotifier for
each, a worker, and the rules of time and the machinery every flow has: the clock moves, a
worker drains, the scanner passes, a trigger delivers timer ids again. A flow's ``model`` keeps
``now`` and ``orders`` and says ``due(cutoff)`` and ``run_due(cutoff)`` (what a drain fires);
:meth:`ModelMachine.drained_copy` drains the shadow at the same instant for the flow's
"once drained" checks. :func:`check` runs a machine with the settings the flows share.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import os
import shutil
import sqlite3
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, closing
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test
from sqlalchemy import Engine, create_engine, select

from dueflow import bootstrap
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import InvalidTransition, NotAllowed, NotYourRole
from dueflow.service import orders
from dueflow.service.deps import Deps
from dueflow.service.report import check_invariants
from dueflow.store.schema import timers as t_timers
from dueflow.store.timers import Claimed
from dueflow.worker.runner import Worker
from dueflow.worker.scanner import scan_once
from tests.conftest import START, RecordingNotifier

T = TypeVar("T")

PICK = st.integers(0, 10**6)  # an index into whatever exists, taken modulo its size
FITTING = st.sampled_from([True, True, True, False])  # mostly an order the action fits
SCAN_GRACE = timedelta(seconds=5)
NO_TIMER = 10**9  # a timer id nothing has


class InOrderWorker(Worker):
    """The real worker, its handlers and claims, but the kinds of a batch take turns (in the
    order the batch was claimed) instead of running side by side: hypothesis replays every
    example and needs each to run the same way (a pay deadline and a show's cancel due in one
    batch otherwise end either way, and later steps draw differently). The races between kinds
    run with real concurrency in tests/contract/test_seat_races.py and test_ticket_timeouts.py."""

    def __init__(self, deps: Deps) -> None:
        super().__init__(deps)
        self._turn = asyncio.Lock()  # FIFO: the kinds' tasks start in claim order

    async def _run_kind(self, kind: TimerKind, group: Sequence[Claimed]) -> None:
        async with self._turn:
            await super()._run_kind(kind, group)


def not_yours(o: Any, user_id: int) -> type[Exception]:
    """The refusal of another party's action: the order's other party is told the role it
    needs (NotYourRole), anyone else learns only that it is not theirs (NotAllowed)."""
    return NotYourRole if user_id in (o.buyer, o.seller) else NotAllowed


def refusal(o: Any, user_id: int, rightful: int, status: str) -> type[Exception] | None:
    """What a party's move on order ``o`` says: not theirs, not now, or nothing (it is done)."""
    if user_id != rightful:
        return not_yours(o, user_id)
    return None if o.status == status else InvalidTransition


async def promises(deps: Deps, *, drained: bool) -> None:
    """dueflow's own check of the promises of docs/design.md; "no order past its deadline" only
    counts once the worker has drained."""
    result = await check_invariants(deps, tolerance_seconds=0)
    if not drained:
        result.past_deadline = []
    assert result.ok, result


def sent(notifier: RecordingNotifier) -> Counter[tuple[int, str, str | None]]:
    """What the notifier was asked to send: (order, kind, reason) counted."""
    return Counter((r.order_id, r.kind, r.reason) for r in notifier.sent)


_numbers = itertools.count()


class ModelMachine(RuleBasedStateMachine):
    """One flow's life against its model; a flow sets ``name``, builds its world in
    :meth:`populate` (which sets ``self.model``) and adds its people's rules and invariants."""

    template: ClassVar[Path]
    workdir: ClassVar[Path]
    #: Names the example's database files.
    name: ClassVar[str]
    #: The worker that drains (the real one, or :class:`InOrderWorker` where kinds meet).
    worker_class: ClassVar[type[Worker]] = Worker
    #: The flow's moves of the clock (the ``advance`` and ``time_passes_with_a_worker`` rules).
    clock_moves: ClassVar[st.SearchStrategy[timedelta]]
    #: Set for a flow whose orders ship: who acts instead of the rightful party (None: that
    #: party, else an index into the users) in the rules of :data:`PARTY_MOVES`.
    others: ClassVar[st.SearchStrategy[int | None]]
    model: Any
    users: list[int]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "clock_moves" in cls.__dict__:
            cls.advance = rule(delta=cls.clock_moves)(ModelMachine.advance)  # type: ignore[method-assign]
            cls.time_passes_with_a_worker = rule(delta=cls.clock_moves)(  # type: ignore[method-assign]
                ModelMachine.time_passes_with_a_worker
            )
        if "others" in cls.__dict__:
            for move in PARTY_MOVES:
                setattr(cls, move.name, move.rule(cls.others))

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.stack = AsyncExitStack()
        n = next(_numbers)
        self.path = self.workdir / f"{self.name}{n}.db"
        self.shadow_path = self.workdir / f"{self.name}-shadow{n}.db"
        shutil.copyfile(self.template, self.path)
        shutil.copyfile(self.template, self.shadow_path)
        self.clock = FakeClock(START)
        self.shadow_clock = FakeClock(START)
        self.notifier = RecordingNotifier()
        self.shadow_notifier = RecordingNotifier()
        self.run(self.setup())

    async def setup(self) -> None:
        def open_deps(
            path: Path, clock: FakeClock, notifier: RecordingNotifier
        ) -> AbstractAsyncContextManager[Deps]:
            config = load_settings(database_url=f"sqlite:///{path}", profile="prod")
            return bootstrap.running(config, clock=clock, notifier=notifier, migrate_sqlite=False)

        self.deps = await self.stack.enter_async_context(
            open_deps(self.path, self.clock, self.notifier)
        )
        self.shadow = await self.stack.enter_async_context(
            open_deps(self.shadow_path, self.shadow_clock, self.shadow_notifier)
        )
        self.worker = self.worker_class(self.deps)
        self.engine = create_engine(f"sqlite:///{self.path}")
        self.shadow_engine = create_engine(f"sqlite:///{self.shadow_path}")
        await self.populate()

    async def populate(self) -> None:
        """The flow's users, things for sale and ``self.model`` (through the service layer)."""
        raise NotImplementedError

    def teardown(self) -> None:
        try:
            self.run(self.stack.aclose())
        finally:
            self.loop.close()
            for engine in (getattr(self, "engine", None), getattr(self, "shadow_engine", None)):
                if engine is not None:
                    engine.dispose()
        self.path.unlink(missing_ok=True)
        self.shadow_path.unlink(missing_ok=True)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def attempt(self, coro: Coroutine[Any, Any, T], expected: type[Exception] | None) -> T | None:
        """Run a service call; it must raise exactly ``expected`` (or succeed when None)."""
        try:
            value = self.run(coro)
        except Exception as exc:
            if expected is None or type(exc) is not expected:
                raise AssertionError(f"raised {exc!r}, want {expected}") from exc
            return None
        assert expected is None, f"succeeded, want {expected.__name__}"
        return value

    def order(self, pick: int, fitting: bool, *statuses: str) -> Any:
        """An order: with ``fitting``, one in ``statuses`` if there is one; else any."""
        ids = sorted(self.model.orders)
        fit = [i for i in ids if self.model.orders[i].status in statuses]
        ids = fit if fitting and fit else ids
        return self.model.orders[ids[pick % len(ids)]]

    def party(self, rightful: int, other: int | None) -> int:
        """The rightful party (``other`` None), or the user at index ``other``."""
        return rightful if other is None else self.users[other]

    # -- what a flow's model adds to the machinery

    def fire(self, timer: Any) -> None:
        """The model fires the (scheduled, due) timer of row ``timer`` alone."""
        self.model.fire(self.model.orders[timer.order_id], timer.kind)

    def settle(self, model: Any, engine: Engine) -> None:
        """After a worker ran: the model takes any pick it left to the worker from ``engine``."""

    def received(self, o: Any) -> None:
        """The model's move when the buyer confirms receipt of ``o``."""
        raise NotImplementedError

    # -- time and the machinery

    def advance(self, delta: timedelta) -> None:
        self.model.now = self.clock.advance(delta)

    def time_passes_with_a_worker(self, delta: timedelta) -> None:
        self.advance(delta)
        self.drain()

    @rule()
    def drain(self) -> None:
        fired = self.model.run_due(self.model.now)
        assert self.run(self.worker.drain()) == fired
        self.settle(self.model, self.engine)

    @rule()
    def scan(self) -> None:
        fired = self.model.run_due(self.model.now - SCAN_GRACE)
        report = self.run(scan_once(self.worker))
        assert (report.claimed, report.errors, report.failed_batches) == (fired, 0, 0)
        self.settle(self.model, self.engine)

    @precondition(lambda self: self.model.orders)
    @rule(pick=PICK, copies=st.integers(1, 3), stray=st.booleans())
    def deliver_again(self, pick: int, copies: int, stray: bool) -> None:
        """A trigger hands over a timer id (maybe several times in one batch, maybe beside one
        that does not exist); only a scheduled, due timer acts, once."""
        with self.engine.connect() as conn:
            rows = list(conn.execute(select(t_timers).order_by(t_timers.c.id)).all())
        timer = rows[pick % len(rows)]
        state, due = self.model.orders[timer.order_id].timers[timer.kind]
        acts = state == "scheduled" and due <= self.model.now
        ids = [timer.id] * copies + ([NO_TIMER] if stray else [])
        assert self.run(self.worker.deliver(ids)) == int(acts)
        if acts:
            self.fire(timer)

    # -- after every step

    def drained_copy(self) -> Any | None:
        """When something is due: the database copied to the shadow, drained there by a worker
        at the same instant (and dueflow's own check of every promise, "no order past its
        deadline" included, holding there); returns the model drained alike (None when nothing
        is due)."""
        if not self.model.due(self.model.now):
            return None
        with (
            closing(sqlite3.connect(self.path)) as src,
            closing(sqlite3.connect(self.shadow_path)) as dst,
        ):
            src.backup(dst)
        self.shadow_clock.set(self.model.now)
        self.shadow_notifier.sent.clear()
        drained = copy.deepcopy(self.model)
        fired = drained.run_due(drained.now)

        async def drain_copy() -> None:
            assert await self.worker_class(self.shadow).drain() == fired
            await promises(self.shadow, drained=True)

        self.run(drain_copy())
        self.settle(drained, self.shadow_engine)
        return drained


@dataclass(frozen=True)
class PartyMove:
    """One party's move on an order of a flow whose orders ship: the rule ``name`` picks an
    order (mostly one in ``status``), lets its rightful ``party`` (or someone else) ``call`` the
    service and expects the refusal :func:`refusal` names; on success the model ``moves``."""

    name: str
    party: str  # buyer | seller
    status: str
    call: Callable[[Deps, int, int], Coroutine[Any, Any, Any]]
    moves: Callable[[ModelMachine, Any], None]

    def rule(self, others: st.SearchStrategy[int | None]) -> Callable[..., None]:
        def move(machine: ModelMachine, pick: int, fitting: bool, other: int | None) -> None:
            o = machine.order(pick, fitting, self.status)
            rightful = getattr(o, self.party)
            user_id = machine.party(rightful, other)
            expected = refusal(o, user_id, rightful, self.status)
            machine.attempt(self.call(machine.deps, o.id, user_id), expected)
            if expected is None:
                self.moves(machine, o)

        move.__name__ = move.__qualname__ = self.name
        decorated = rule(pick=PICK, fitting=FITTING, other=others)(move)
        return precondition(lambda machine: machine.model.orders)(decorated)  # type: ignore[no-any-return]


PARTY_MOVES = (
    PartyMove(
        "buyer_cancels",
        "buyer",
        "pending_payment",
        lambda deps, order_id, user_id: orders.cancel_by_buyer(
            deps, order_id=order_id, user_id=user_id
        ),
        lambda machine, o: machine.model.cancel_unpaid(o, "buyer_cancel"),
    ),
    PartyMove(
        "ship",
        "seller",
        "pending_shipment",
        lambda deps, order_id, user_id: orders.ship(
            deps, order_id=order_id, user_id=user_id, carrier="SF", tracking_no="7"
        ),
        lambda machine, o: machine.model.ship(o),
    ),
    PartyMove(
        "seller_cancels",
        "seller",
        "pending_shipment",
        lambda deps, order_id, user_id: orders.cancel_by_seller(
            deps, order_id=order_id, user_id=user_id
        ),
        lambda machine, o: machine.model.cancel_unshipped(o, "seller_cancel"),
    ),
    PartyMove(
        "confirm_receipt",
        "buyer",
        "shipped",
        lambda deps, order_id, user_id: orders.confirm_receipt(
            deps, order_id=order_id, user_id=user_id
        ),
        lambda machine, o: machine.received(o),
    ),
)


def from_env(*, examples: int, steps: int) -> dict[str, int]:
    """``examples`` and ``steps``, unless ``DUEFLOW_TEST_MODEL_EXAMPLES`` and
    ``DUEFLOW_TEST_MODEL_STEPS`` ask for a longer run."""
    return {
        "examples": int(os.environ.get("DUEFLOW_TEST_MODEL_EXAMPLES", str(examples))),
        "steps": int(os.environ.get("DUEFLOW_TEST_MODEL_STEPS", str(steps))),
    }


def check(
    machine: type[ModelMachine], template: Path, workdir: Path, *, examples: int, steps: int
) -> None:
    """Run ``machine`` for ``examples`` examples of up to ``steps`` steps each."""
    machine.template = template
    machine.workdir = workdir
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
