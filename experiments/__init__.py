"""The training harness: Hydra entry point (train.py), configs (conf/), data, models, the loop and plots."""
