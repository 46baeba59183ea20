"""``verde-chain train`` moved to ``verde_chain/train_cli.py`` (it is a command, not graph logic);
these names stay importable from here while other branches still use the old path."""

from verde_chain.train_cli import configure, job_of, main, run

__all__ = ["configure", "job_of", "main", "run"]
