"""Our own processes that witness an agent from outside: they see its calls and can refuse them."""
