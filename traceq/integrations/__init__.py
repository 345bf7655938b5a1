"""Recording traces from other libraries' training loops (`transformers`' `Trainer`)."""
