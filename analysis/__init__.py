"""analysis: after the fact only. MLflow -> pandas, statistics, seaborn figures, tables and
reports, read from the MLflow store alone (no torch work, no Ray). Import the submodule you need.
"""
