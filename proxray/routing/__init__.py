"""The router: one weight formula (``weights``), nearest-neighbour search (``index``), the decision rule and
budgets (``objective``), ProxRouter's machinery (``prox``) and its two families (``knn``, ``kmeans``), their hyperparameters stated once (``params``), the temperatures that ship
(``temperature``), baselines, one registry of router classes (``registry``) and versioned artifacts."""
