"""Template tags of the console's templates."""
