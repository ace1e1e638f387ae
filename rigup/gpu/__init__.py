"""GPU knowledge shared by roles: facts, catalogue, plan."""
