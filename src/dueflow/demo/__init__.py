"""``dueflow demo``: simulated people playing a whole sale against the engine, then the outcomes
and the invariants checked.

It is a product command (the README's tour runs it, the wheel serves it), so it ships in the
package; nothing of the engine imports it. One module per flow, in process (fast time, its own
SQLite) or over HTTP against a running ``dueflow serve``:

* :mod:`~dueflow.demo.marketplace` and :mod:`~dueflow.demo.http`: the marketplace (the people,
  their habits and the outcome tables every flow shares; the HTTP client every flow shares);
* :mod:`~dueflow.demo.tickets` and :mod:`~dueflow.demo.http_tickets`: a ticket sale;
* :mod:`~dueflow.demo.shop` and :mod:`~dueflow.demo.http_shop`: a shop, its people in
  :mod:`~dueflow.demo.shop_crowd` and its own checks in :mod:`~dueflow.demo.shop_checks`.
"""
