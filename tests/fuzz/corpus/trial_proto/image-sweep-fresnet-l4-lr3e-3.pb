
image-sweepimage-sweep-fresnet-l4-lr3e-3"
family"resnet"

nLayer"
learningRateú~j¼t“h?*
resnet  (€0€@
2H
	images-u8*/work/main/examples/images/data/shapes.binš™™™™™¹? €*:T
adamwú~j¼t“h?  –(0282@I{®Gáz„?QÍÌÌÌÌÌì?YÍÌÌÌÌÌì?a+‡ÙÎ÷ï?i:Œ0âŽyE>zconstantBhost