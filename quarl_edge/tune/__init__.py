"""`quarl-edge tune`: search the deployable variants of a policy on the target device (search.py), judged by closed-loop reward and device latency; outputs in report.py."""
