"""The run loop, the run state, and one reducer module per retention mode."""
