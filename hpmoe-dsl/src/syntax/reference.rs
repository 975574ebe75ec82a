//! The pest reference grammar (see hpm.pest).
