"""Off-policy residual RL: replay, anchor data, learner."""
