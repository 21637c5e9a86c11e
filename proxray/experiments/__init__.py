"""Measuring routers: the paper's protocols (``protocols``: leave-task-out, few-shot outliers, budgets) and the
metrics (``metrics``: normalized AUC over the accuracy–cost hull, top-z sets)."""
