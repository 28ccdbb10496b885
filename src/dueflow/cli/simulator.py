"""``dueflow simulator``: a local Alipay and WeChat Pay v3 simulator."""

from __future__ import annotations

import asyncio

import typer

from dueflow.cli._common import err


def simulator(
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(8090, min=1, max=65535, help="TCP port."),
    time_scale: float = typer.Option(
        1.0, min=0.001, help="Divide the providers' notification retry delays by this."
    ),
) -> None:
    """Serve a local Alipay and WeChat Pay v3 simulator (fresh keys each start; GET
    /control/keys tells a client what it needs)."""
    from dueflow.payments.simulator import SimulatorConfig
    from dueflow.payments.simulator.app import serve

    config = SimulatorConfig.generate(time_scale=time_scale)
    err.print(f"simulator on http://{host}:{port} (keys: http://{host}:{port}/control/keys)")
    asyncio.run(serve(config, host, port))
