

tiny-sweeptiny-sweep-lr1e-3"
learningRateü©ñÒMbP?*
gpt2  ( 0€@
2;
text#/work/main/examples/data/corpus.txtš™™™™™©? @*  :S
adamwü©ñÒMbP? ((08@I{®Gáz„?QÍÌÌÌÌÌì?YÍÌÌÌÌÌì?a+‡ÙÎ÷ï?i:Œ0âŽyE>zconstantB€€€€host