"""Reading the output table back: run summaries, the report and its plot."""
