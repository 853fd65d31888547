"""Robot runtime (one control loop), inference server and learner service."""
