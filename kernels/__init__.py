"""Futhark sources of microgpt-gui (a package only so that installs ship the .fut files)."""
