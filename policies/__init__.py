"""Memory policies (MFit, AMFit, MAdvise) and Salus lane admission: issues to come."""
