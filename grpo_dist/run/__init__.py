"""A run's lifecycle on the driver: outputs, pre-flight, workers, checkpoints, evaluation, resume, monitors."""
