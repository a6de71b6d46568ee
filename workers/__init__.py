"""Models, tasks, training and the Ray Tune search: the only package that imports torch and Ray."""
