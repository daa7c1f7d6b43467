"""Pre-tokenizers for byte-level BPE vocabularies: text -> words, split the way llama.cpp splits.

A BPE vocabulary (``tokenizer.ggml.model = gpt2``) names its pre-tokenizer in
``tokenizer.ggml.pre``. Each pre-tokenizer is a list of regular expressions applied in turn:
the first splits the text, each next one splits every piece again, and the stretches a regex
does not match stay pieces of their own. BPE merges then run inside each piece.

llama.cpp matches these regexes on a *collapsed* copy of the text, one character per code
point: ASCII stays as it is, and every other code point becomes a stand-in for its Unicode
class (letter, number, punctuation, mark, symbol, other; whitespace becomes ``\\v``). A
``\\p{L}`` in a regex then means "the letter stand-in or an ASCII letter". We do the same, with
the same Unicode version (15.1) and whitespace set as llama.cpp's tables, so the splits agree
code point for code point whatever Python's own Unicode database says. The regex engine is
the standard library's ``re`` with ``re.ASCII`` (so ``\\s`` is ``[ \\t\\n\\v\\f\\r]``, as in C).
A regex without any ``\\p{..}`` runs on the text with only non-ASCII whitespace replaced.

For the three pre-tokenizers llama.cpp hand-codes (gpt-2, llama3, qwen2) the regex here is
the one those hand-written splitters implement; the vocabulary tests check them against
llama.cpp's own test vectors.
"""

from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass

__all__ = ["PRE_TOKENIZERS", "PreTokenizer", "get_pre_tokenizer", "unicode_class"]

# ---------------------------------------------------------------------------------------------
# Unicode classes of the non-ASCII code points, Unicode 15.1 (the version llama.cpp's tables
# are generated from). Each entry is "<first code point, hex><class>"; the class holds up to
# the next entry. Classes: L letter, N number, P punctuation, M mark, S symbol, w whitespace
# (the White_Space property), o anything else. Regenerate with Python 3.13 (Unicode 15.1):
#     python3.13 pyllm/text/pretokenizers.py
_UCD_RUNS = (
    "80o 85w 86o a0w a1P a2S a7P a8S aaL abP acS ado aeS b2N b4S b5L b6P b8S b9N baL bbP bcN bfP c0L d7S d8L f7S "
    "f8L 2c2S 2c6L 2d2S 2e0L 2e5S 2ecL 2edS 2eeL 2efS 300M 370L 375S 376L 378o 37aL 37eP 37fL 380o 384S 386L 387P "
    "388L 38bo 38cL 38do 38eL 3a2o 3a3L 3f6S 3f7L 482S 483M 48aL 530o 531L 557o 559L 55aP 560L 589P 58bo 58dS 590o "
    "591M 5beP 5bfM 5c0P 5c1M 5c3P 5c4M 5c6P 5c7M 5c8o 5d0L 5ebo 5efL 5f3P 5f5o 606S 609P 60bS 60cP 60eS 610M 61bP "
    "61co 61dP 620L 64bM 660N 66aP 66eL 670M 671L 6d4P 6d5L 6d6M 6ddo 6deS 6dfM 6e5L 6e7M 6e9S 6eaM 6eeL 6f0N 6faL "
    "6fdS 6ffL 700P 70eo 710L 711M 712L 730M 74bo 74dL 7a6M 7b1L 7b2o 7c0N 7caL 7ebM 7f4L 7f6S 7f7P 7faL 7fbo 7fdM "
    "7feS 800L 816M 81aL 81bM 824L 825M 828L 829M 82eo 830P 83fo 840L 859M 85co 85eP 85fo 860L 86bo 870L 888S 889L "
    "88fo 898M 8a0L 8caM 8e2o 8e3M 904L 93aM 93dL 93eM 950L 951M 958L 962M 964P 966N 970P 971L 981M 984o 985L 98do "
    "98fL 991o 993L 9a9o 9aaL 9b1o 9b2L 9b3o 9b6L 9bao 9bcM 9bdL 9beM 9c5o 9c7M 9c9o 9cbM 9ceL 9cfo 9d7M 9d8o 9dcL "
    "9deo 9dfL 9e2M 9e4o 9e6N 9f0L 9f2S 9f4N 9faS 9fcL 9fdP 9feM 9ffo a01M a04o a05L a0bo a0fL a11o a13L a29o a2aL "
    "a31o a32L a34o a35L a37o a38L a3ao a3cM a3do a3eM a43o a47M a49o a4bM a4eo a51M a52o a59L a5do a5eL a5fo a66N "
    "a70M a72L a75M a76P a77o a81M a84o a85L a8eo a8fL a92o a93L aa9o aaaL ab1o ab2L ab4o ab5L abao abcM abdL abeM "
    "ac6o ac7M acao acbM aceo ad0L ad1o ae0L ae2M ae4o ae6N af0P af1S af2o af9L afaM b00o b01M b04o b05L b0do b0fL "
    "b11o b13L b29o b2aL b31o b32L b34o b35L b3ao b3cM b3dL b3eM b45o b47M b49o b4bM b4eo b55M b58o b5cL b5eo b5fL "
    "b62M b64o b66N b70S b71L b72N b78o b82M b83L b84o b85L b8bo b8eL b91o b92L b96o b99L b9bo b9cL b9do b9eL ba0o "
    "ba3L ba5o ba8L babo baeL bbao bbeM bc3o bc6M bc9o bcaM bceo bd0L bd1o bd7M bd8o be6N bf3S bfbo c00M c05L c0do "
    "c0eL c11o c12L c29o c2aL c3ao c3cM c3dL c3eM c45o c46M c49o c4aM c4eo c55M c57o c58L c5bo c5dL c5eo c60L c62M "
    "c64o c66N c70o c77P c78N c7fS c80L c81M c84P c85L c8do c8eL c91o c92L ca9o caaL cb4o cb5L cbao cbcM cbdL cbeM "
    "cc5o cc6M cc9o ccaM cceo cd5M cd7o cddL cdfo ce0L ce2M ce4o ce6N cf0o cf1L cf3M cf4o d00M d04L d0do d0eL d11o "
    "d12L d3bM d3dL d3eM d45o d46M d49o d4aM d4eL d4fS d50o d54L d57M d58N d5fL d62M d64o d66N d79S d7aL d80o d81M "
    "d84o d85L d97o d9aL db2o db3L dbco dbdL dbeo dc0L dc7o dcaM dcbo dcfM dd5o dd6M dd7o dd8M de0o de6N df0o df2M "
    "df4P df5o e01L e31M e32L e34M e3bo e3fS e40L e47M e4fP e50N e5aP e5co e81L e83o e84L e85o e86L e8bo e8cL ea4o "
    "ea5L ea6o ea7L eb1M eb2L eb4M ebdL ebeo ec0L ec5o ec6L ec7o ec8M ecfo ed0N edao edcL ee0o f00L f01S f04P f13S "
    "f14P f15S f18M f1aS f20N f34S f35M f36S f37M f38S f39M f3aP f3eM f40L f48o f49L f6do f71M f85P f86M f88L f8dM "
    "f98o f99M fbdo fbeS fc6M fc7S fcdo fceS fd0P fd5S fd9P fdbo 1000L 102bM 103fL 1040N 104aP 1050L 1056M 105aL "
    "105eM 1061L 1062M 1065L 1067M 106eL 1071M 1075L 1082M 108eL 108fM 1090N 109aM 109eS 10a0L 10c6o 10c7L 10c8o "
    "10cdL 10ceo 10d0L 10fbP 10fcL 1249o 124aL 124eo 1250L 1257o 1258L 1259o 125aL 125eo 1260L 1289o 128aL 128eo "
    "1290L 12b1o 12b2L 12b6o 12b8L 12bfo 12c0L 12c1o 12c2L 12c6o 12c8L 12d7o 12d8L 1311o 1312L 1316o 1318L 135bo "
    "135dM 1360P 1369N 137do 1380L 1390S 139ao 13a0L 13f6o 13f8L 13feo 1400P 1401L 166dS 166eP 166fL 1680w 1681L "
    "169bP 169do 16a0L 16ebP 16eeN 16f1L 16f9o 1700L 1712M 1716o 171fL 1732M 1735P 1737o 1740L 1752M 1754o 1760L "
    "176do 176eL 1771o 1772M 1774o 1780L 17b4M 17d4P 17d7L 17d8P 17dbS 17dcL 17ddM 17deo 17e0N 17eao 17f0N 17fao "
    "1800P 180bM 180eo 180fM 1810N 181ao 1820L 1879o 1880L 1885M 1887L 18a9M 18aaL 18abo 18b0L 18f6o 1900L 191fo "
    "1920M 192co 1930M 193co 1940S 1941o 1944P 1946N 1950L 196eo 1970L 1975o 1980L 19aco 19b0L 19cao 19d0N 19dbo "
    "19deS 1a00L 1a17M 1a1co 1a1eP 1a20L 1a55M 1a5fo 1a60M 1a7do 1a7fM 1a80N 1a8ao 1a90N 1a9ao 1aa0P 1aa7L 1aa8P "
    "1aaeo 1ab0M 1acfo 1b00M 1b05L 1b34M 1b45L 1b4do 1b50N 1b5aP 1b61S 1b6bM 1b74S 1b7dP 1b7fo 1b80M 1b83L 1ba1M "
    "1baeL 1bb0N 1bbaL 1be6M 1bf4o 1bfcP 1c00L 1c24M 1c38o 1c3bP 1c40N 1c4ao 1c4dL 1c50N 1c5aL 1c7eP 1c80L 1c89o "
    "1c90L 1cbbo 1cbdL 1cc0P 1cc8o 1cd0M 1cd3P 1cd4M 1ce9L 1cedM 1ceeL 1cf4M 1cf5L 1cf7M 1cfaL 1cfbo 1d00L 1dc0M "
    "1e00L 1f16o 1f18L 1f1eo 1f20L 1f46o 1f48L 1f4eo 1f50L 1f58o 1f59L 1f5ao 1f5bL 1f5co 1f5dL 1f5eo 1f5fL 1f7eo "
    "1f80L 1fb5o 1fb6L 1fbdS 1fbeL 1fbfS 1fc2L 1fc5o 1fc6L 1fcdS 1fd0L 1fd4o 1fd6L 1fdco 1fddS 1fe0L 1fedS 1ff0o "
    "1ff2L 1ff5o 1ff6L 1ffdS 1fffo 2000w 200bo 2010P 2028w 202ao 202fw 2030P 2044S 2045P 2052S 2053P 205fw 2060o "
    "2070N 2071L 2072o 2074N 207aS 207dP 207fL 2080N 208aS 208dP 208fo 2090L 209do 20a0S 20c1o 20d0M 20f1o 2100S "
    "2102L 2103S 2107L 2108S 210aL 2114S 2115L 2116S 2119L 211eS 2124L 2125S 2126L 2127S 2128L 2129S 212aL 212eS "
    "212fL 213aS 213cL 2140S 2145L 214aS 214eL 214fS 2150N 2183L 2185N 218aS 218co 2190S 2308P 230cS 2329P 232bS "
    "2427o 2440S 244bo 2460N 249cS 24eaN 2500S 2768P 2776N 2794S 27c5P 27c7S 27e6P 27f0S 2983P 2999S 29d8P 29dcS "
    "29fcP 29feS 2b74o 2b76S 2b96o 2b97S 2c00L 2ce5S 2cebL 2cefM 2cf2L 2cf4o 2cf9P 2cfdN 2cfeP 2d00L 2d26o 2d27L "
    "2d28o 2d2dL 2d2eo 2d30L 2d68o 2d6fL 2d70P 2d71o 2d7fM 2d80L 2d97o 2da0L 2da7o 2da8L 2dafo 2db0L 2db7o 2db8L "
    "2dbfo 2dc0L 2dc7o 2dc8L 2dcfo 2dd0L 2dd7o 2dd8L 2ddfo 2de0M 2e00P 2e2fL 2e30P 2e50S 2e52P 2e5eo 2e80S 2e9ao "
    "2e9bS 2ef4o 2f00S 2fd6o 2ff0S 3000w 3001P 3004S 3005L 3007N 3008P 3012S 3014P 3020S 3021N 302aM 3030P 3031L "
    "3036S 3038N 303bL 303dP 303eS 3040o 3041L 3097o 3099M 309bS 309dL 30a0P 30a1L 30fbP 30fcL 3100o 3105L 3130o "
    "3131L 318fo 3190S 3192N 3196S 31a0L 31c0S 31e4o 31efS 31f0L 3200S 321fo 3220N 322aS 3248N 3250S 3251N 3260S "
    "3280N 328aS 32b1N 32c0S 3400L 4dc0S 4e00L a48do a490S a4c7o a4d0L a4feP a500L a60dP a610L a620N a62aL a62co "
    "a640L a66fM a673P a674M a67eP a67fL a69eM a6a0L a6e6N a6f0M a6f2P a6f8o a700S a717L a720S a722L a789S a78bL "
    "a7cbo a7d0L a7d2o a7d3L a7d4o a7d5L a7dao a7f2L a802M a803L a806M a807L a80bM a80cL a823M a828S a82cM a82do "
    "a830N a836S a83ao a840L a874P a878o a880M a882L a8b4M a8c6o a8ceP a8d0N a8dao a8e0M a8f2L a8f8P a8fbL a8fcP "
    "a8fdL a8ffM a900N a90aL a926M a92eP a930L a947M a954o a95fP a960L a97do a980M a984L a9b3M a9c1P a9ceo a9cfL "
    "a9d0N a9dao a9deP a9e0L a9e5M a9e6L a9f0N a9faL a9ffo aa00L aa29M aa37o aa40L aa43M aa44L aa4cM aa4eo aa50N "
    "aa5ao aa5cP aa60L aa77S aa7aL aa7bM aa7eL aab0M aab1L aab2M aab5L aab7M aab9L aabeM aac0L aac1M aac2L aac3o "
    "aadbL aadeP aae0L aaebM aaf0P aaf2L aaf5M aaf7o ab01L ab07o ab09L ab0fo ab11L ab17o ab20L ab27o ab28L ab2fo "
    "ab30L ab5bS ab5cL ab6aS ab6co ab70L abe3M abebP abecM abeeo abf0N abfao ac00L d7a4o d7b0L d7c7o d7cbL d7fco "
    "f900L fa6eo fa70L fadao fb00L fb07o fb13L fb18o fb1dL fb1eM fb1fL fb29S fb2aL fb37o fb38L fb3do fb3eL fb3fo "
    "fb40L fb42o fb43L fb45o fb46L fbb2S fbc3o fbd3L fd3eP fd40S fd50L fd90o fd92L fdc8o fdcfS fdd0o fdf0L fdfcS "
    "fe00M fe10P fe1ao fe20M fe30P fe53o fe54P fe62S fe63P fe64S fe67o fe68P fe69S fe6aP fe6co fe70L fe75o fe76L "
    "fefdo ff01P ff04S ff05P ff0bS ff0cP ff10N ff1aP ff1cS ff1fP ff21L ff3bP ff3eS ff3fP ff40S ff41L ff5bP ff5cS "
    "ff5dP ff5eS ff5fP ff66L ffbfo ffc2L ffc8o ffcaL ffd0o ffd2L ffd8o ffdaL ffddo ffe0S ffe7o ffe8S ffefo fffcS "
    "fffeo 10000L 1000co 1000dL 10027o 10028L 1003bo 1003cL 1003eo 1003fL 1004eo 10050L 1005eo 10080L 100fbo 10100P "
    "10103o 10107N 10134o 10137S 10140N 10179S 1018aN 1018cS 1018fo 10190S 1019do 101a0S 101a1o 101d0S 101fdM "
    "101feo 10280L 1029do 102a0L 102d1o 102e0M 102e1N 102fco 10300L 10320N 10324o 1032dL 10341N 10342L 1034aN "
    "1034bo 10350L 10376M 1037bo 10380L 1039eo 1039fP 103a0L 103c4o 103c8L 103d0P 103d1N 103d6o 10400L 1049eo "
    "104a0N 104aao 104b0L 104d4o 104d8L 104fco 10500L 10528o 10530L 10564o 1056fP 10570L 1057bo 1057cL 1058bo "
    "1058cL 10593o 10594L 10596o 10597L 105a2o 105a3L 105b2o 105b3L 105bao 105bbL 105bdo 10600L 10737o 10740L "
    "10756o 10760L 10768o 10780L 10786o 10787L 107b1o 107b2L 107bbo 10800L 10806o 10808L 10809o 1080aL 10836o "
    "10837L 10839o 1083cL 1083do 1083fL 10856o 10857P 10858N 10860L 10877S 10879N 10880L 1089fo 108a7N 108b0o "
    "108e0L 108f3o 108f4L 108f6o 108fbN 10900L 10916N 1091co 1091fP 10920L 1093ao 1093fP 10940o 10980L 109b8o "
    "109bcN 109beL 109c0N 109d0o 109d2N 10a00L 10a01M 10a04o 10a05M 10a07o 10a0cM 10a10L 10a14o 10a15L 10a18o "
    "10a19L 10a36o 10a38M 10a3bo 10a3fM 10a40N 10a49o 10a50P 10a59o 10a60L 10a7dN 10a7fP 10a80L 10a9dN 10aa0o "
    "10ac0L 10ac8S 10ac9L 10ae5M 10ae7o 10aebN 10af0P 10af7o 10b00L 10b36o 10b39P 10b40L 10b56o 10b58N 10b60L "
    "10b73o 10b78N 10b80L 10b92o 10b99P 10b9do 10ba9N 10bb0o 10c00L 10c49o 10c80L 10cb3o 10cc0L 10cf3o 10cfaN "
    "10d00L 10d24M 10d28o 10d30N 10d3ao 10e60N 10e7fo 10e80L 10eaao 10eabM 10eadP 10eaeo 10eb0L 10eb2o 10efdM "
    "10f00L 10f1dN 10f27L 10f28o 10f30L 10f46M 10f51N 10f55P 10f5ao 10f70L 10f82M 10f86P 10f8ao 10fb0L 10fc5N "
    "10fcco 10fe0L 10ff7o 11000M 11003L 11038M 11047P 1104eo 11052N 11070M 11071L 11073M 11075L 11076o 1107fM "
    "11083L 110b0M 110bbP 110bdo 110beP 110c2M 110c3o 110d0L 110e9o 110f0N 110fao 11100M 11103L 11127M 11135o "
    "11136N 11140P 11144L 11145M 11147L 11148o 11150L 11173M 11174P 11176L 11177o 11180M 11183L 111b3M 111c1L "
    "111c5P 111c9M 111cdP 111ceM 111d0N 111daL 111dbP 111dcL 111ddP 111e0o 111e1N 111f5o 11200L 11212o 11213L "
    "1122cM 11238P 1123eM 1123fL 11241M 11242o 11280L 11287o 11288L 11289o 1128aL 1128eo 1128fL 1129eo 1129fL "
    "112a9P 112aao 112b0L 112dfM 112ebo 112f0N 112fao 11300M 11304o 11305L 1130do 1130fL 11311o 11313L 11329o "
    "1132aL 11331o 11332L 11334o 11335L 1133ao 1133bM 1133dL 1133eM 11345o 11347M 11349o 1134bM 1134eo 11350L "
    "11351o 11357M 11358o 1135dL 11362M 11364o 11366M 1136do 11370M 11375o 11400L 11435M 11447L 1144bP 11450N "
    "1145aP 1145co 1145dP 1145eM 1145fL 11462o 11480L 114b0M 114c4L 114c6P 114c7L 114c8o 114d0N 114dao 11580L "
    "115afM 115b6o 115b8M 115c1P 115d8L 115dcM 115deo 11600L 11630M 11641P 11644L 11645o 11650N 1165ao 11660P "
    "1166do 11680L 116abM 116b8L 116b9P 116bao 116c0N 116cao 11700L 1171bo 1171dM 1172co 11730N 1173cP 1173fS "
    "11740L 11747o 11800L 1182cM 1183bP 1183co 118a0L 118e0N 118f3o 118ffL 11907o 11909L 1190ao 1190cL 11914o "
    "11915L 11917o 11918L 11930M 11936o 11937M 11939o 1193bM 1193fL 11940M 11941L 11942M 11944P 11947o 11950N "
    "1195ao 119a0L 119a8o 119aaL 119d1M 119d8o 119daM 119e1L 119e2P 119e3L 119e4M 119e5o 11a00L 11a01M 11a0bL "
    "11a33M 11a3aL 11a3bM 11a3fP 11a47M 11a48o 11a50L 11a51M 11a5cL 11a8aM 11a9aP 11a9dL 11a9eP 11aa3o 11ab0L "
    "11af9o 11b00P 11b0ao 11c00L 11c09o 11c0aL 11c2fM 11c37o 11c38M 11c40L 11c41P 11c46o 11c50N 11c6do 11c70P "
    "11c72L 11c90o 11c92M 11ca8o 11ca9M 11cb7o 11d00L 11d07o 11d08L 11d0ao 11d0bL 11d31M 11d37o 11d3aM 11d3bo "
    "11d3cM 11d3eo 11d3fM 11d46L 11d47M 11d48o 11d50N 11d5ao 11d60L 11d66o 11d67L 11d69o 11d6aL 11d8aM 11d8fo "
    "11d90M 11d92o 11d93M 11d98L 11d99o 11da0N 11daao 11ee0L 11ef3M 11ef7P 11ef9o 11f00M 11f02L 11f03M 11f04L "
    "11f11o 11f12L 11f34M 11f3bo 11f3eM 11f43P 11f50N 11f5ao 11fb0L 11fb1o 11fc0N 11fd5S 11ff2o 11fffP 12000L "
    "1239ao 12400N 1246fo 12470P 12475o 12480L 12544o 12f90L 12ff1P 12ff3o 13000L 13430o 13440M 13441L 13447M "
    "13456o 14400L 14647o 16800L 16a39o 16a40L 16a5fo 16a60N 16a6ao 16a6eP 16a70L 16abfo 16ac0N 16acao 16ad0L "
    "16aeeo 16af0M 16af5P 16af6o 16b00L 16b30M 16b37P 16b3cS 16b40L 16b44P 16b45S 16b46o 16b50N 16b5ao 16b5bN "
    "16b62o 16b63L 16b78o 16b7dL 16b90o 16e40L 16e80N 16e97P 16e9bo 16f00L 16f4bo 16f4fM 16f50L 16f51M 16f88o "
    "16f8fM 16f93L 16fa0o 16fe0L 16fe2P 16fe3L 16fe4M 16fe5o 16ff0M 16ff2o 17000L 187f8o 18800L 18cd6o 18d00L "
    "18d09o 1aff0L 1aff4o 1aff5L 1affco 1affdL 1afffo 1b000L 1b123o 1b132L 1b133o 1b150L 1b153o 1b155L 1b156o "
    "1b164L 1b168o 1b170L 1b2fco 1bc00L 1bc6bo 1bc70L 1bc7do 1bc80L 1bc89o 1bc90L 1bc9ao 1bc9cS 1bc9dM 1bc9fP "
    "1bca0o 1cf00M 1cf2eo 1cf30M 1cf47o 1cf50S 1cfc4o 1d000S 1d0f6o 1d100S 1d127o 1d129S 1d165M 1d16aS 1d16dM "
    "1d173o 1d17bM 1d183S 1d185M 1d18cS 1d1aaM 1d1aeS 1d1ebo 1d200S 1d242M 1d245S 1d246o 1d2c0N 1d2d4o 1d2e0N "
    "1d2f4o 1d300S 1d357o 1d360N 1d379o 1d400L 1d455o 1d456L 1d49do 1d49eL 1d4a0o 1d4a2L 1d4a3o 1d4a5L 1d4a7o "
    "1d4a9L 1d4ado 1d4aeL 1d4bao 1d4bbL 1d4bco 1d4bdL 1d4c4o 1d4c5L 1d506o 1d507L 1d50bo 1d50dL 1d515o 1d516L "
    "1d51do 1d51eL 1d53ao 1d53bL 1d53fo 1d540L 1d545o 1d546L 1d547o 1d54aL 1d551o 1d552L 1d6a6o 1d6a8L 1d6c1S "
    "1d6c2L 1d6dbS 1d6dcL 1d6fbS 1d6fcL 1d715S 1d716L 1d735S 1d736L 1d74fS 1d750L 1d76fS 1d770L 1d789S 1d78aL "
    "1d7a9S 1d7aaL 1d7c3S 1d7c4L 1d7cco 1d7ceN 1d800S 1da00M 1da37S 1da3bM 1da6dS 1da75M 1da76S 1da84M 1da85S "
    "1da87P 1da8co 1da9bM 1daa0o 1daa1M 1dab0o 1df00L 1df1fo 1df25L 1df2bo 1e000M 1e007o 1e008M 1e019o 1e01bM "
    "1e022o 1e023M 1e025o 1e026M 1e02bo 1e030L 1e06eo 1e08fM 1e090o 1e100L 1e12do 1e130M 1e137L 1e13eo 1e140N "
    "1e14ao 1e14eL 1e14fS 1e150o 1e290L 1e2aeM 1e2afo 1e2c0L 1e2ecM 1e2f0N 1e2fao 1e2ffS 1e300o 1e4d0L 1e4ecM "
    "1e4f0N 1e4fao 1e7e0L 1e7e7o 1e7e8L 1e7eco 1e7edL 1e7efo 1e7f0L 1e7ffo 1e800L 1e8c5o 1e8c7N 1e8d0M 1e8d7o "
    "1e900L 1e944M 1e94bL 1e94co 1e950N 1e95ao 1e95eP 1e960o 1ec71N 1ecacS 1ecadN 1ecb0S 1ecb1N 1ecb5o 1ed01N "
    "1ed2eS 1ed2fN 1ed3eo 1ee00L 1ee04o 1ee05L 1ee20o 1ee21L 1ee23o 1ee24L 1ee25o 1ee27L 1ee28o 1ee29L 1ee33o "
    "1ee34L 1ee38o 1ee39L 1ee3ao 1ee3bL 1ee3co 1ee42L 1ee43o 1ee47L 1ee48o 1ee49L 1ee4ao 1ee4bL 1ee4co 1ee4dL "
    "1ee50o 1ee51L 1ee53o 1ee54L 1ee55o 1ee57L 1ee58o 1ee59L 1ee5ao 1ee5bL 1ee5co 1ee5dL 1ee5eo 1ee5fL 1ee60o "
    "1ee61L 1ee63o 1ee64L 1ee65o 1ee67L 1ee6bo 1ee6cL 1ee73o 1ee74L 1ee78o 1ee79L 1ee7do 1ee7eL 1ee7fo 1ee80L "
    "1ee8ao 1ee8bL 1ee9co 1eea1L 1eea4o 1eea5L 1eeaao 1eeabL 1eebco 1eef0S 1eef2o 1f000S 1f02co 1f030S 1f094o "
    "1f0a0S 1f0afo 1f0b1S 1f0c0o 1f0c1S 1f0d0o 1f0d1S 1f0f6o 1f100N 1f10dS 1f1aeo 1f1e6S 1f203o 1f210S 1f23co "
    "1f240S 1f249o 1f250S 1f252o 1f260S 1f266o 1f300S 1f6d8o 1f6dcS 1f6edo 1f6f0S 1f6fdo 1f700S 1f777o 1f77bS "
    "1f7dao 1f7e0S 1f7eco 1f7f0S 1f7f1o 1f800S 1f80co 1f810S 1f848o 1f850S 1f85ao 1f860S 1f888o 1f890S 1f8aeo "
    "1f8b0S 1f8b2o 1f900S 1fa54o 1fa60S 1fa6eo 1fa70S 1fa7do 1fa80S 1fa89o 1fa90S 1fabeo 1fabfS 1fac6o 1faceS "
    "1fadco 1fae0S 1fae9o 1faf0S 1faf9o 1fb00S 1fb93o 1fb94S 1fbcbo 1fbf0N 1fbfao 20000L 2a6e0o 2a700L 2b73ao "
    "2b740L 2b81eo 2b820L 2cea2o 2ceb0L 2ebe1o 2ebf0L 2ee5eo 2f800L 2fa1eo 30000L 3134bo 31350L 323b0o e0100M "
    "e01f0o "
)

_UCD_STARTS: list[int] = []
_UCD_CLASSES: list[str] = []
for _entry in _UCD_RUNS.split():
    _UCD_STARTS.append(int(_entry[:-1], 16))
    _UCD_CLASSES.append(_entry[-1])
del _entry

# The stand-in characters of the collapsed text (non-ASCII, so never confused with the ASCII
# that stays as it is; every non-ASCII code point of the input is replaced by one of them).
_STAND_IN = {"o": "\xd0", "N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5", "w": "\x0b"}

# What a \p{..} class stands for in a collapsed regex: its stand-in and its ASCII members.
# llama.cpp knows the letter subclasses only as "letter", so \p{Lu} matches any letter there.
_CLASS_BODY = {
    "L": "\xd2A-Za-z",
    "N": "\xd10-9",
    "P": "\xd3" + r"!-#%-*,-/:;?@\[-\]_{}",
    "S": "\xd5" + r"$+<->^`|~",
    "M": "\xd4",
}
for _sub in ("Lu", "Ll", "Lt", "Lm", "Lo"):
    _CLASS_BODY[_sub] = _CLASS_BODY["L"]
del _sub


def unicode_class(cp: int) -> str:
    """The class llama.cpp gives a code point: 'L', 'N', 'P', 'M', 'S', 'w' (whitespace) or 'o'.

    ASCII follows the same classes (letters L, digits N, ``\\t\\n\\v\\f\\r`` and space w, ...).
    """
    if cp < 0x80:
        ch = chr(cp)
        if ch in " \t\n\v\f\r":
            return "w"
        if ch.isalpha():
            return "L"
        if ch.isdigit():
            return "N"
        if re.fullmatch(f"[{_CLASS_BODY['P'][1:]}]", ch):
            return "P"
        if re.fullmatch(f"[{_CLASS_BODY['S'][1:]}]", ch):
            return "S"
        return "o"
    if cp > 0x10FFFF:
        return "o"
    return _UCD_CLASSES[bisect.bisect_right(_UCD_STARTS, cp) - 1]


class _CollapseTable(dict):
    """A ``str.translate`` table: ASCII stays, any other code point becomes its stand-in.

    Filled lazily, one entry per code point seen, so it costs nothing up front.
    """

    def __missing__(self, cp: int) -> int:
        if cp < 0x80:
            value = cp
        else:
            value = ord(_STAND_IN[_UCD_CLASSES[bisect.bisect_right(_UCD_STARTS, cp) - 1]])
        self[cp] = value
        return value


_COLLAPSE = _CollapseTable()
# For a regex without \p{..}: only non-ASCII whitespace changes (to \v), as llama.cpp does.
_WHITESPACE_ONLY = {
    start + i: 0x0B
    for start, cls, end in zip(_UCD_STARTS, _UCD_CLASSES, [*_UCD_STARTS[1:], 0x110000], strict=True)
    if cls == "w"
    for i in range(end - start)
}


def _collapse_pattern(pattern: str) -> tuple[str, bool]:
    """Rewrite the \\p{..} classes of `pattern` for the collapsed text; also say if there were any."""
    out: list[str] = []
    inside = False
    used = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            m = re.match(r"\\p\{(\w+)\}", pattern[i:])
            if m is not None:
                body = _CLASS_BODY.get(m.group(1))
                if body is None:
                    raise ValueError(f"unsupported Unicode class {m.group(0)} in pre-tokenizer regex {pattern!r}")
                out.append(body if inside else f"[{body}]")
                used = True
                i += m.end()
                continue
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if c == "[" and not inside:
            inside = True
        elif c == "]" and inside:
            inside = False
        out.append(c)
        i += 1
    return "".join(out), used


# ---------------------------------------------------------------------------------------------
# The regexes. Contractions match case by case ('[sS]), as llama.cpp does, never by Unicode
# case folding (which would also take the long s, U+017F); "(?:CI)" in a regex stands for them.

_CI = r"'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = r"(?:CI)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = r"(?:CI)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (
    r"(?:CI)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UFAKZEKA = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_SEED_CODER = r"(?:CI)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
_BAILINGMOE = (
    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"
)
_MINICPM5 = r"(?:CI)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_JAIS2 = (
    r"(?:CI)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
    + r"|\s{1,2}(?!\S)|\s{1}"
)
# Upper-then-lower letter runs, written with lookaheads since llama.cpp cannot tell letter cases
# apart outside ASCII (a non-ASCII letter counts as both).
_UPPER_STAR_LOWER_PLUS = r"(?:(?=\p{L})[^a-z])*(?:(?=\p{L})[^A-Z])+"
_UPPER_PLUS_LOWER_STAR = r"(?:(?=\p{L})[^a-z])+(?:(?=\p{L})[^A-Z])*"
_GRANITE_EMB_MULTI = (
    r"[^\r\n\p{L}\p{N}]?(?:(?=[\p{L}\p{M}])[^a-z])*(?:(?=[\p{L}\p{M}])[^A-Z])+(?:CI)?"
    r"|[^\r\n\p{L}\p{N}]?(?:(?=[\p{L}\p{M}])[^a-z])+(?:(?=[\p{L}\p{M}])[^A-Z])*(?:CI)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_YOUTU = (
    r"[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f"
    r"\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:CI)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:CI)?"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER_STAR_LOWER_PLUS}(?:CI)?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER_PLUS_LOWER_STAR}(?:CI)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER_STAR_LOWER_PLUS}|[^\r\n\p{{L}}\p{{N}}]?{_UPPER_PLUS_LOWER_STAR}"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_EXAONE_MOE = (
    r"(?:CI)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?"
    r"|\s*[\r\n]|\s+(?!\S)|\s+"
)
_CJK = r"[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_HAN_KANA = r"[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"
_DEEPSEEK3 = (
    r"[!-/:-@\[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_DEEPSEEK_LLM_LETTERS = (
    r"\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    r"\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    r"\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf"
    r"\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
    r"\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4"
    r"\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    r"\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    r"\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    r"\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
    r"\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb"
    r"\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+"
)
_DEEPSEEK_LLM = (
    r"[\r\n]",
    _DEEPSEEK_LLM_LETTERS,
    r"\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+\Z",  # ECMAScript '$': the very end only
    _CJK,
    r"\p{N}+",
)
_SPARK2_5 = (
    r"\p{N}{1,3}",
    _HAN_KANA,
    r"[!-/:-@\[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
    r"\p{N}",
)
_BLOOM = r" ?[^(\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"


@dataclass(frozen=True)
class PreTokenizer:
    """How a BPE vocabulary turns text into words before merging.

    Attributes:
        name: the family name (the first of the ``tokenizer.ggml.pre`` values it serves).
        regexes: applied in turn, each splitting the pieces the previous ones left.
        byte_encode: map each word's UTF-8 bytes to the GPT-2 byte alphabet before merging.
        clean_spaces: decoding removes the space before ``?!.,`` and some contractions.
        ignore_merges: a word that is a token as a whole becomes that token, unmerged.
        add_bos: the default for ``tokenizer.ggml.add_bos_token`` when the file has none.
        no_bos: the vocabulary has no BOS token whatever the file says (chatglm).
    """

    name: str
    regexes: tuple[str, ...]
    byte_encode: bool = True
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool = False
    no_bos: bool = False

    @functools.cached_property
    def _steps(self) -> tuple[tuple[re.Pattern[str], bool], ...]:
        """The compiled regexes (compiled on first use), each with whether it runs collapsed."""
        steps = []
        for regex in self.regexes:
            pattern, collapsed = _collapse_pattern(regex.replace("(?:CI)", f"(?:{_CI})"))
            steps.append((re.compile(pattern, re.ASCII), collapsed))
        return tuple(steps)

    def split(self, text: str) -> list[str]:
        """Split `text` (code points as llama.cpp decoded them) into words."""
        if not text:
            return []
        n = len(text)
        views: dict[bool, str] = {}
        spans = [(0, n)]
        for pattern, collapsed in self._steps:
            view = views.get(collapsed)
            if view is None:
                view = views[collapsed] = text.translate(_COLLAPSE if collapsed else _WHITESPACE_ONLY)
            out: list[tuple[int, int]] = []
            for start, end in spans:
                piece = view if (start == 0 and end == n) else view[start:end]
                pos = 0
                for m in pattern.finditer(piece):
                    a, b = m.span()
                    if a > pos:
                        out.append((start + pos, start + a))
                    if b > a:  # an empty match only marks a split point
                        out.append((start + a, start + b))
                    pos = b
                if start + pos < end:
                    out.append((start + pos, end))
            spans = out
        return [text[a:b] for a, b in spans]


def _family(names: str, *regexes: str, **options: bool) -> list[tuple[str, PreTokenizer]]:
    keys = names.split()
    pre = PreTokenizer(keys[0], tuple(regexes), **options)
    return [(key, pre) for key in keys]


_DEFAULT = (r"[\p{P}$+<=>^~|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")
_STARCODER = (r"\p{N}", _GPT2)

# tokenizer.ggml.pre -> pre-tokenizer, following llama.cpp's list (llama-vocab.cpp).
PRE_TOKENIZERS: dict[str, PreTokenizer] = dict(
    _family("default", *_DEFAULT)
    + _family("gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert exaone4"
              " jina-v1-en jina-v2-code roberta-bpe mpt olmo jais", _GPT2)
    + _family("trillion", _GPT2, clean_spaces=False)
    + _family("granite-docling", _GPT2, clean_spaces=False)
    + _family("llama-bpe llama3 llama-v3 falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", _LLAMA3,
              ignore_merges=True, add_bos=True)
    + _family("dbrx smaug-bpe", _LLAMA3)
    + _family("chatglm-bpe", _LLAMA3, no_bos=True)
    + _family("glm4 glm5", _LLAMA3, no_bos=True, ignore_merges=True)
    + _family("jais-2", _JAIS2)
    + _family("deepseek-llm", *_DEEPSEEK_LLM, clean_spaces=False)
    + _family("deepseek-coder", r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}", clean_spaces=False)
    + _family("deepseek-v3 hunyuan-dense hy_v4 joyai-llm", r"\p{N}{1,3}", _HAN_KANA, _DEEPSEEK3, clean_spaces=False)
    + _family("falcon", r"[\p{P}$+<=>^~|`]+", _GPT2, r"[0-9][0-9][0-9]")
    + _family("starcoder refact codeshell exaone minerva-7b mellum2", *_STARCODER)
    + _family("smollm command-r", *_STARCODER, clean_spaces=False)
    + _family("qwen2 deepseek-r1-qwen kormo f2llmv2 hunyuan solar-open grok-2", _QWEN2, clean_spaces=False)
    + _family("megrez stablelm2", _QWEN2)
    + _family("qwen35", _QWEN35, clean_spaces=False)
    + _family("ufakzeka", _UFAKZEKA, clean_spaces=False)
    + _family("seed-coder", _SEED_CODER, clean_spaces=False)
    + _family("bailingmoe bailingmoe2 llada-moe", _BAILINGMOE, clean_spaces=False)
    + _family("minicpm5", r"\p{N}{1,3}", _MINICPM5, ignore_merges=True)
    + _family("laguna", r"[^\n]+|[\n]+", _QWEN2, clean_spaces=False)
    + _family("exaone-moe", _EXAONE_MOE)
    + _family("gpt-4o llama4 kanana2 talkie minimax-m2", _GPT4O, clean_spaces=False)
    + _family("granite-embed-multi-97m", _GRANITE_EMB_MULTI, clean_spaces=False, ignore_merges=True)
    + _family("youtu", *_YOUTU, clean_spaces=False, ignore_merges=True)
    + _family("spark2_5", *_SPARK2_5, clean_spaces=False)
    + _family("superbpe", r"\p{N}+", r"(?=(\d{3})+(?!\d))", clean_spaces=False)  # digits in threes from the right
    + _family("tekken", _TEKKEN, clean_spaces=False, ignore_merges=True, add_bos=True)
    + _family("bloom gpt3-finnish", _BLOOM)
    + _family("poro-chat", _BLOOM, clean_spaces=False)
    + _family("viking", _BLOOM, r"\p{N}", clean_spaces=False)
    + _family("chameleon", r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )",
              r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", _GPT2, clean_spaces=False, add_bos=True)
)

# Known to llama.cpp but split by hand-written code that pyllm does not reproduce.
UNSUPPORTED_PRE = frozenset(
    "gemma4 granite-embed-multi-311m sarvam-moe whitespace kimi-k2 afmoe tiny_aya cohere2moe".split()
)


def get_pre_tokenizer(name: str) -> PreTokenizer:
    """The pre-tokenizer for a ``tokenizer.ggml.pre`` value; KeyError if there is none."""
    return PRE_TOKENIZERS[name]


if __name__ == "__main__":  # regenerate _UCD_RUNS (needs a Python whose unicodedata is 15.1)
    import sys
    import textwrap
    import unicodedata

    if unicodedata.unidata_version != "15.1.0":
        sys.exit(f"this Python has Unicode {unicodedata.unidata_version}; llama.cpp's tables are 15.1.0")
    white = {0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000}
    runs, last = [], None
    for cp in range(0x80, 0x110000):
        cls = "w" if cp in white else unicodedata.category(chr(cp))[0]
        cls = cls if cls in "LNPMSw" else "o"
        if cls != last:
            runs.append(f"{cp:x}{cls}")
            last = cls
    print("_UCD_RUNS = (")
    for line in textwrap.wrap(" ".join(runs), 110):
        print(f'    "{line} "')
    print(")")
