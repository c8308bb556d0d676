"""Shared machinery of log-based adapters (Kafka, the local test log): subscriptions as
cursors over shared append-only logs, served by a bounded number of readers."""
