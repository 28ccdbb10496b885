"""Use cases as plain async functions taking what they need (a :class:`~dueflow.service.deps.Deps`)."""
