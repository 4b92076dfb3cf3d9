

tiny-sweeptiny-sweep-lr3e-3"
learningRateú~j¼t“h?*
gpt2  ( 0€@
2;
text#/work/main/examples/data/corpus.txtš™™™™™©? @*  :S
adamwú~j¼t“h? ((08@I{®Gáz„?QÍÌÌÌÌÌì?YÍÌÌÌÌÌì?a+‡ÙÎ÷ï?i:Œ0âŽyE>zconstantB€€€€host