"""analysis: probes (scikit-learn, run inside a trial), MLflow -> pandas, statistics, seaborn
figures and reports (which read only the MLflow store). Import the submodule you need.
"""
