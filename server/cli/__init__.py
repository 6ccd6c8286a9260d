"""The `seq2serve` console command and its client-side subcommands."""
