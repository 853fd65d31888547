"""Base policies (chunk predictors) and the residual actor/critic."""
