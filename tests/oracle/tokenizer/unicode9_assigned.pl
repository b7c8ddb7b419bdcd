#!/usr/bin/perl
# Prints the code point ranges assigned as of Unicode 9.0 ("FIRST LAST" in hex, one per line).
# Input to `tokenizer_oracle_tool nfc9-table`, which writes src/text/unicode9_nfc_table.inc:
# HF tokenizers' NFC (unicode-normalization-alignments 0.1.12) uses Unicode 9.0 data.
# Uses only Perl's core Unicode::UCD (Perl 5.36 knows Unicode 14, so "In=9.0" is exact).
use strict;
use warnings;
use Unicode::UCD qw(prop_invlist);

my @list = prop_invlist('In=9.0');
die "no inversion list for In=9.0\n" unless @list;
for (my $i = 0; $i < @list; $i += 2) {
  my $first = $list[$i];
  my $last = $i + 1 < @list ? $list[$i + 1] - 1 : 0x10FFFF;
  printf "%X %X\n", $first, $last;
}
