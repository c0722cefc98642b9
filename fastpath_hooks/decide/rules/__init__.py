"""The rules of each kind of kernel (registry `kind`): one module per kind, one entry point each,
`decide(ctx, kernel, decided) -> Decision`, called by the driver (decide/policy.py) in the order of
the registry's needs/serves graph, with the decisions made so far."""
