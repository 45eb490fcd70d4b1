# decode.test.txt: hypothesis<TAB>reference; words w0..w599; the rarest 60 are w540..w599
BEGIN { FS = "\t" }
{ k = (substr($2, 2) + 0 >= 540) ? "rarest-60 targets" : "other targets"; n[k]++; if ($1 != $2) e[k]++ }
END { for (k in n) printf "%-18s %5d of %5d wrong = %.2f %%\n", k, e[k], n[k], 100 * e[k] / n[k] }
