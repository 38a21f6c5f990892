"""Placement: filter and score nodes for each worker of a job (best-fit, FGD and the FGD
paper's baselines, topology for gangs), chosen by name from ``registry``."""
