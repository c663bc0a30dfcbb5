from fedjax_dro.cli import entry

entry()
