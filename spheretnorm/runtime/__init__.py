"""The training runtime that train.py runs: configuration, token files and batches, the
learning-rate schedule, the run folder and checkpoints, the validation loss, tracking, stop
signals and the process group. It imports the model core (spheretnorm.model and its kernels),
never the integrations (data preparation, zero-shot, Hugging Face) or the experiment tooling."""
