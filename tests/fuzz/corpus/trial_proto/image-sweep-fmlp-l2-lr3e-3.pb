
image-sweepimage-sweep-fmlp-l2-lr3e-3"
family"mlp"

nLayer"
learningRateú~j¼t“h?*
mlp  (€0€@
2H
	images-u8*/work/main/examples/images/data/shapes.binš™™™™™¹? €*:T
adamwú~j¼t“h?  –(0282@I{®Gáz„?QÍÌÌÌÌÌì?YÍÌÌÌÌÌì?a+‡ÙÎ÷ï?i:Œ0âŽyE>zconstantBhost