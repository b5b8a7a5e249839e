"""Icons and the style sheet of the window (a package only so that installs ship them)."""
