"""What a run leaves for people: the one MLflow writer, the summary, the diagnosis, the pictures,
usage and audit reports."""
