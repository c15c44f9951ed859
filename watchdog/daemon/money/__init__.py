"""The tick's money: prices, backfill, period budgets, live spend, drift alarms."""
