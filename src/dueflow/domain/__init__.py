"""Pure business rules: statuses, the transition table, deadlines, money. Imports nothing else of dueflow but exceptions."""
