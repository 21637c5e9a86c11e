"""The router: one weight formula (``weights``), nearest-neighbour search (``index``), the decision rule and
budgets (``objective``), ProxRouter over kNN and KMeans (``routers``), the temperatures that ship
(``temperature``), baselines, one registry of router classes (``registry``) and versioned artifacts."""
